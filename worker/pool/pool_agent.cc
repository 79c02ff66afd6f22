#include "worker/pool/pool_agent.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "common/regular_file.h"
#include "proto/wire_names.h"
#include "proto/wire_version.h"
#include "trainyard.pb.h"

namespace trainyard {
namespace {

constexpr double kMaxBackoffS = 16;
constexpr int64_t kMaxMessageBytes = 64 << 20;  // an Assign carries a job file
constexpr size_t kOutputChunkBytes = 64 << 10;  // coordinator/job_output.h: kMaxOutputChunkBytes
constexpr double kOutputGatherS = 0.25;         // lines gather this long into one chunk
constexpr double kOutputResendS = 5;            // a chunk not acknowledged by then goes again
// Note [Artifacts] in coordinator/artifacts.h: the bounds of one answer about a job's files.
constexpr size_t kMaxListedFiles = 10000;
constexpr int kMaxListedDepth = 16;
constexpr size_t kMaxChunkBytes = size_t(1) << 20;

std::string Serialize(wire::Envelope envelope) {
  envelope.set_version(kProtocolVersion);
  return envelope.SerializeAsString();
}

std::string EpochKey(int64_t job, int attempt, int64_t epoch) {
  return "epoch:" + std::to_string(job) + ":" + std::to_string(attempt) + ":" + std::to_string(epoch);
}

std::string ResultKey(int64_t job, int attempt) {
  return "result:" + std::to_string(job) + ":" + std::to_string(attempt);
}

}  // namespace

static_assert(int(JobEnd::kSucceeded) == wire::OUTCOME_SUCCEEDED && int(JobEnd::kFailed) == wire::OUTCOME_FAILED &&
                  int(JobEnd::kBadInput) == wire::OUTCOME_BAD_INPUT &&
                  int(JobEnd::kCancelled) == wire::OUTCOME_CANCELLED &&
                  int(JobEnd::kReleased) == wire::OUTCOME_RELEASED &&
                  int(JobEnd::kPreempted) == wire::OUTCOME_PREEMPTED,
              "JobEnd's values are the wire's Outcome");

std::string JobEndName(JobEnd end) { return OutcomeName(ToWire(end)); }

wire::Outcome ToWire(JobEnd end) { return static_cast<wire::Outcome>(end); }

JobEnd JobEndFromWire(wire::Outcome end) {
  for (JobEnd known : {JobEnd::kSucceeded, JobEnd::kFailed, JobEnd::kBadInput, JobEnd::kCancelled, JobEnd::kReleased,
                       JobEnd::kPreempted})
    if (ToWire(known) == end) return known;
  return JobEnd::kFailed;
}

Assignment AssignmentFrom(const wire::Assign& a) {
  Assignment out{a.job_id(), a.attempt(), a.yaml(), a.source(), a.base_dir(), a.runs_dir(), {}, a.resume()};
  for (const wire::JobPlace& p : a.places()) out.places.push_back({p.world(), p.rank(), p.host(), p.slot()});
  out.elastic_replicas = a.elastic_replicas();
  out.elastic_replica = a.elastic_replica();
  return out;
}

void ToWire(const Assignment& a, wire::Assign* out) {
  out->set_job_id(a.job_id);
  out->set_attempt(a.attempt);
  out->set_yaml(a.yaml);
  out->set_source(a.source);
  out->set_base_dir(a.base_dir);
  out->set_runs_dir(a.runs_dir);
  out->set_resume(a.resume);
  out->set_elastic_replicas(a.elastic_replicas);
  out->set_elastic_replica(a.elastic_replica);
  for (const JobPlace& p : a.places) {
    wire::JobPlace* place = out->add_places();
    place->set_world(p.world);
    place->set_rank(p.rank);
    place->set_host(p.host);
    place->set_slot(p.slot);
  }
}

void CheckEndpoint(const std::string& endpoint) {
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  try {
    socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw std::invalid_argument("--coordinator " + endpoint + ": not a usable ZeroMQ endpoint (" + e.what() +
                                "); expected e.g. tcp://127.0.0.1:5555");
  }
}

struct PoolAgent::Link {
  zmq::context_t context{1};
  std::unique_ptr<zmq::socket_t> socket;
  std::unique_ptr<zmq::socket_t> events;  // the socket's connection events (zmq_socket_monitor)
  int sockets_made = 0;                   // names each one's monitor endpoint
  bool up = false;                        // a handshake succeeded, and no drop since
  bool was_up = false;                    // registered before: a handshake now is a reconnection
  Clock::time_point last_beat{};

  void Send(const std::string& bytes) { (void)socket->send(zmq::buffer(bytes), zmq::send_flags::dontwait); }
};

// The link thread, and ZeroMQ's I/O threads it starts (they inherit its mask), take no
// asynchronous signal: the process's handlers (SIGTERM, SIGINT in pool_runtime.cc) run
// on the main thread, which decides what a signal means, and never interrupt a poll.
// Faults stay deliverable: blocking them is undefined.
namespace {
void BlockAsynchronousSignals() {
  sigset_t signals;
  sigfillset(&signals);
  for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&signals, fault);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}
}  // namespace

PoolAgent::PoolAgent(PoolOptions options, RankIdentity self) : options_(std::move(options)), self_(std::move(self)) {
  thread_ = std::thread([this] {
    BlockAsynchronousSignals();
    Loop();
  });
}

PoolAgent::~PoolAgent() {
  quitting_ = true;
  thread_.join();
}

std::optional<Assignment> PoolAgent::WaitForAssignment(const std::atomic<bool>& stop, double timeout_s) {
  const Clock::time_point since = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (assignments_.empty()) {
    if (stop || SecondsSince(since) > timeout_s) return std::nullopt;
    assigned_.wait_for(lock, std::chrono::milliseconds(200));
  }
  Assignment next = std::move(assignments_.front());
  assignments_.pop_front();
  return next;
}

void PoolAgent::Begin(const Assignment& assignment) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_id_ = assignment.job_id;
  attempt_ = assignment.attempt;
  elastic_replica_ = assignment.elastic_replica;
  output_ = OutputStream{};
  output_.job = assignment.job_id;
  output_.attempt = assignment.attempt;
  quorum_outbox_.clear();
  quorum_awaiting_.clear();
  quorum_answers_.clear();
  stop_preempt_ = false;
  stop_grace_s_ = 0;
  stop_requested_ = false;
}

void PoolAgent::Finish(const JobOutcome& outcome) {
  wire::Envelope e;
  wire::JobResult* result = e.mutable_result();
  int64_t job = 0;
  int attempt = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job = job_id_;
    attempt = attempt_;
    result->set_elastic_replica(elastic_replica_);
    job_id_ = 0;
    attempt_ = 0;
  }
  result->set_job_id(job);
  result->set_attempt(attempt);
  result->set_world_rank(self_.rank);
  result->set_world(self_.world);
  result->set_end(ToWire(outcome.end));
  result->set_message(outcome.message);
  result->set_summary_json(outcome.summary_json);
  result->set_rank_token(self_.rank_token);
  Queue(ResultKey(job, attempt), Serialize(e));
}

void PoolAgent::ReportEpoch(const wire::EpochReport& report) {
  wire::Envelope e;
  wire::EpochReport* out = e.mutable_epoch();
  *out = report;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out->set_job_id(job_id_);
    out->set_attempt(attempt_);
  }
  out->set_world(self_.world);
  out->set_world_rank(self_.rank);
  out->set_rank_token(self_.rank_token);
  Queue(EpochKey(out->job_id(), out->attempt(), out->epoch()), Serialize(e));
}

void PoolAgent::AppendOutput(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (output_.job == 0) return;
  output_.pending += line;
  output_.pending += '\n';
  if (output_.pending.size() <= kMaxPendingOutputBytes) return;
  // The coordinator has been away a while: the oldest lines go, and it notes the gap.
  const size_t newline = output_.pending.find('\n', output_.pending.size() - kMaxPendingOutputBytes);
  const size_t dropped = newline == std::string::npos ? output_.pending.size() : newline + 1;
  output_.pending.erase(0, dropped);
  output_.base += int64_t(dropped);
  if (output_.in_flight_end <= output_.base) output_.in_flight_end = 0;
}

bool PoolAgent::DrainOutput(double timeout_s) {
  const auto start = Clock::now();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (output_.pending.empty()) return true;
    }
    if (SecondsSince(start) >= timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void PoolAgent::Queue(std::string key, std::string bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  outbox_.emplace_back(std::move(key), std::move(bytes));
}

void PoolAgent::SendToQuorum(const wire::Envelope& message) {
  wire::Envelope e = message;
  std::lock_guard<std::mutex> lock(mutex_);
  if (job_id_ == 0) return;
  auto sign = [&](auto* m) {
    m->set_job_id(job_id_);
    m->set_attempt(attempt_);
    m->set_world(self_.world);
    m->set_world_rank(self_.rank);
    m->set_rank_token(self_.rank_token);
  };
  if (e.has_replica_join())
    sign(e.mutable_replica_join());
  else if (e.has_replica_beat())
    sign(e.mutable_replica_beat());
  else if (e.has_step_vote())
    sign(e.mutable_step_vote());
  else
    return;
  quorum_outbox_.push_back(Serialize(e));
  if (!e.has_replica_beat()) quorum_awaiting_ = quorum_outbox_.back();
}

std::vector<std::string> PoolAgent::TakeQuorumAnswers() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> answers(std::make_move_iterator(quorum_answers_.begin()),
                                   std::make_move_iterator(quorum_answers_.end()));
  quorum_answers_.clear();
  return answers;
}

std::optional<std::string> PoolAgent::AwaitQuorumAnswer(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto has_answer = [this] { return !quorum_answers_.empty(); };
  if (!quorum_answered_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)), has_answer))
    return std::nullopt;
  std::string answer = std::move(quorum_answers_.front());
  quorum_answers_.pop_front();
  return answer;
}

void PoolAgent::KeepQuorumAnswer(const wire::Envelope& answer, int64_t job, int attempt) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job != job_id_ || attempt != attempt_) return;
    quorum_awaiting_.clear();
    quorum_answers_.push_back(Serialize(answer));
    if (quorum_answers_.size() > kMaxQuorumAnswers) quorum_answers_.pop_front();
  }
  quorum_answered_.notify_all();
}

bool PoolAgent::Drain(double timeout_s) {
  const auto start = Clock::now();
  while (SecondsSince(start) < timeout_s) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (unacked_.empty() && outbox_.empty()) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Note [Link liveness]
// The coordinator sends a rank nothing unasked, so that its loop does not pulse every
// rank every second. Whether the coordinator is there is ZeroMQ's own business: the
// agent's socket sends ZMTP PINGs (RFC 37) every `heartbeat` seconds, which the
// coordinator's I/O thread answers without its loop. No traffic for `liveness`
// heartbeats (a stopped or unreachable coordinator, a half-open connection), or a closed
// one, drops the connection, and ZeroMQ connects again with backoff (0.5 s, doubling to
// 16 s); the PINGs' TTL tells the coordinator's side to drop a silent agent's connection
// too. Every handshake that succeeds (the first one, and each after a drop) is followed
// by a registration naming the job still running and by every unacknowledged report, so
// a restarted coordinator re-adopts the rank and a paused one hears it the moment it
// resumes. Heartbeats, reports and output go only while the link is up; they wait for
// the registration meanwhile. Every failure of one round (EINTR from a signal, a socket
// error) is logged and the next round goes on, on a new socket if the old one failed.
void PoolAgent::Loop() {
  Link link;
  while (!quitting_) {
    try {
      if (!link.socket) Connect(link);
      Round(link);
    } catch (const std::exception& e) {
      if (const auto* z = dynamic_cast<const zmq::error_t*>(&e); z && z->num() == EINTR) continue;
      LogWarn(StrFormat("the link to the coordinator at %s: %s; reconnecting", options_.endpoint.c_str(), e.what()));
      link.socket.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void PoolAgent::Round(Link& link) {
  zmq::pollitem_t items[] = {{static_cast<void*>(*link.socket), 0, ZMQ_POLLIN, 0},
                             {static_cast<void*>(*link.events), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 2, std::chrono::milliseconds(20));
  for (zmq::message_t frame; link.socket->recv(frame, zmq::recv_flags::dontwait);) {
    wire::Envelope in;
    if (in.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) Handle(link, in);
  }
  ReadLinkEvents(link);
  if (!link.up) return;
  FlushOutbox(link);
  FlushQuorum(link);
  FlushOutput(link);
  if (SecondsSince(link.last_beat) >= options_.heartbeat_s) Heartbeat(link);
}

// Note [Link liveness]: a handshake makes the link up and registers; a drop (ZMTP
// heartbeats unanswered, or the coordinator gone) makes it down until ZeroMQ's next
// handshake.
void PoolAgent::ReadLinkEvents(Link& link) {
  for (zmq::message_t event; link.events->recv(event, zmq::recv_flags::dontwait);) {
    zmq::message_t address;
    (void)link.events->recv(address, zmq::recv_flags::dontwait);  // the event's second frame
    uint16_t id = 0;
    if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      if (link.was_up) LogInfo(StrFormat("the link to the coordinator at %s is back", options_.endpoint.c_str()));
      link.up = link.was_up = true;
      Register(link);
    } else if (id == ZMQ_EVENT_DISCONNECTED && link.up) {
      LogWarn(
          StrFormat("the link to the coordinator at %s dropped (no answer for %.1f s, or it closed); "
                    "connecting again with backoff",
                    options_.endpoint.c_str(), options_.heartbeat_s * options_.liveness));
      link.up = false;
    }
  }
}

void PoolAgent::Connect(Link& link) {
  link.events.reset();
  link.socket = std::make_unique<zmq::socket_t>(link.context, zmq::socket_type::dealer);
  link.socket->set(zmq::sockopt::linger, 0);
  link.socket->set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
  const int beat_ms = std::max(1, int(options_.heartbeat_s * 1000));
  const int silent_ms = std::max(beat_ms, int(options_.heartbeat_s * options_.liveness * 1000));
  link.socket->set(zmq::sockopt::heartbeat_ivl, beat_ms);
  link.socket->set(zmq::sockopt::heartbeat_timeout, silent_ms);
  link.socket->set(zmq::sockopt::heartbeat_ttl, silent_ms);
  link.socket->set(zmq::sockopt::reconnect_ivl, 500);
  link.socket->set(zmq::sockopt::reconnect_ivl_max, int(kMaxBackoffS * 1000));
  if (!options_.insecure) MakeCurveClient(*link.socket, options_.keys);
  const std::string events = "inproc://pool-agent-link-" + std::to_string(++link.sockets_made);
  if (zmq_socket_monitor(static_cast<void*>(*link.socket), events.c_str(),
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) != 0)
    throw zmq::error_t();
  link.events = std::make_unique<zmq::socket_t>(link.context, zmq::socket_type::pair);
  link.events->connect(events);
  link.up = false;
  link.socket->connect(options_.endpoint);
}

void PoolAgent::Register(Link& link) {
  wire::Envelope e;
  wire::Register* reg = e.mutable_register_();
  wire::RankInfo* info = reg->mutable_rank();
  info->set_world(self_.world);
  info->set_rank(self_.rank);
  info->set_world_size(self_.world_size);
  info->set_host(self_.host);
  info->set_device(self_.device);
  info->set_pid(self_.pid);
  info->set_slot(self_.slot);
  reg->set_world_token(self_.world_token);
  reg->set_rank_token(self_.rank_token);
  std::lock_guard<std::mutex> lock(mutex_);
  reg->set_job_id(job_id_);
  reg->set_attempt(attempt_);
  link.Send(Serialize(e));
  for (const auto& [key, bytes] : unacked_) link.Send(bytes);
  if (!quorum_awaiting_.empty()) link.Send(quorum_awaiting_);  // answered again, or fenced
  output_.in_flight_end = 0;                                   // sent again by the next round
}

void PoolAgent::Handle(Link& link, const wire::Envelope& in) {
  if (in.has_error()) {  // a refusal: this rank's messages are not being counted
    LogWarn(StrFormat("the coordinator refused a message: %s", in.error().message().c_str()));
  } else if (in.has_reregister()) {
    Register(link);
  } else if (in.has_assign()) {
    Assignment next = AssignmentFrom(in.assign());
    std::lock_guard<std::mutex> lock(mutex_);
    assignments_.push_back(std::move(next));
    assigned_.notify_all();
  } else if (in.has_stop()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in.stop().job_id() == job_id_ && in.stop().attempt() == attempt_ && !stop_requested_) {
      stop_preempt_ = in.stop().preempt();
      stop_grace_s_ = std::max(0.0, in.stop().grace_s());
      stop_requested_ = true;
      LogInfo(StrFormat("job %ld: stop requested (%s)", long(job_id_), in.stop().reason().c_str()));
    }
  } else if (in.has_step_decision()) {
    KeepQuorumAnswer(in, in.step_decision().job_id(), in.step_decision().attempt());
  } else if (in.has_fenced()) {
    KeepQuorumAnswer(in, in.fenced().job_id(), in.fenced().attempt());
  } else if (in.has_list_files()) {
    link.Send(Serialize(FilesOf(in.list_files())));
  } else if (in.has_read_file()) {
    link.Send(Serialize(ChunkOf(in.read_file())));
  } else if (in.has_ack() && in.ack().what() == "output") {
    OutputAcknowledged(in.ack());
  } else if (in.has_ack()) {
    const wire::Ack& ack = in.ack();
    const std::string key = ack.what() == "epoch" ? EpochKey(ack.job_id(), ack.attempt(), ack.epoch())
                                                  : ResultKey(ack.job_id(), ack.attempt());
    std::lock_guard<std::mutex> lock(mutex_);
    unacked_.erase(
        std::remove_if(unacked_.begin(), unacked_.end(), [&](const auto& item) { return item.first == key; }),
        unacked_.end());
  }
}

namespace {

// Note [Artifacts]: an agent answers only for a job's folder beneath the runs folder.
bool JobFolder(const std::string& relative) {
  const std::string first = relative.substr(0, relative.find('/'));
  return !first.empty() && first.size() <= 18 && first.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

// The request an answer is to, and this rank (its name and token) as its sender.
template <typename Answer>
void PoolAgent::FillSender(int64_t request_id, Answer* out) const {
  out->set_request_id(request_id);
  out->set_world(self_.world);
  out->set_world_rank(self_.rank);
  out->set_rank_token(self_.rank_token);
}

wire::Envelope PoolAgent::FilesOf(const wire::ListFiles& ask) const {
  wire::Envelope e;
  wire::FileList* out = e.mutable_file_list();
  FillSender(ask.request_id(), out);
  if (!JobFolder(ask.relative()) || ask.relative().find('/') != std::string::npos) {
    out->set_error("not a job's folder: " + ask.relative());
    return e;
  }
  try {
    bool truncated = false;
    for (const FileEntry& file :
         ListFilesBeneath(ask.root(), ask.relative(), kMaxListedFiles, kMaxListedDepth, &truncated)) {
      wire::Artifact* added = out->add_files();
      added->set_path(file.path);
      added->set_size(file.size);
      added->set_modified(file.modified);
    }
    out->set_truncated(truncated);
  } catch (const std::exception& err) {
    out->set_error(err.what());
  }
  return e;
}

wire::Envelope PoolAgent::ChunkOf(const wire::ReadFileChunk& ask) const {
  wire::Envelope e;
  wire::FileChunk* out = e.mutable_file_chunk();
  FillSender(ask.request_id(), out);
  if (!JobFolder(ask.relative())) {
    out->set_error("not in a job's folder: " + ask.relative());
    out->set_missing(true);
    return e;
  }
  const size_t most = std::min<size_t>(std::max(0, ask.max_bytes()), kMaxChunkBytes);
  const FileRead read = ReadRangeBeneath(ask.root(), ask.relative(), ask.offset(), most);
  if (!read.ok()) {
    out->set_error(read.why);
    out->set_missing(read.status == FileRead::kMissing || read.status == FileRead::kRefused);
    return e;
  }
  out->set_data(read.bytes);
  out->set_size(read.size);
  return e;
}

void PoolAgent::FlushOutbox(Link& link) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& item : outbox_) {
    link.Send(item.second);
    unacked_.push_back(std::move(item));
  }
  outbox_.clear();
}

void PoolAgent::FlushQuorum(Link& link) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const std::string& bytes : quorum_outbox_) link.Send(bytes);
  quorum_outbox_.clear();
}

// One chunk in flight at a time, of whole lines, once they have gathered a moment
// (Note [Job output]).
void PoolAgent::FlushOutput(Link& link) {
  std::lock_guard<std::mutex> lock(mutex_);
  OutputStream& o = output_;
  if (o.job == 0 || o.pending.empty()) return;
  if (o.in_flight_end > 0 && SecondsSince(o.sent_at) < kOutputResendS) return;
  if (o.in_flight_end == 0 && o.pending.size() < kOutputChunkBytes / 4 && SecondsSince(o.sent_at) < kOutputGatherS)
    return;
  size_t size = std::min(o.pending.size(), kOutputChunkBytes);
  if (size < o.pending.size()) size = o.pending.rfind('\n', size - 1) + 1;  // lines are shorter than a chunk
  wire::Envelope e;
  wire::JobOutput* chunk = e.mutable_output();
  chunk->set_job_id(o.job);
  chunk->set_attempt(o.attempt);
  chunk->set_offset(o.base);
  chunk->set_text(o.pending.substr(0, size));
  chunk->set_world(self_.world);
  chunk->set_world_rank(self_.rank);
  chunk->set_rank_token(self_.rank_token);
  link.Send(Serialize(e));
  o.in_flight_end = o.base + int64_t(size);
  o.sent_at = Clock::now();
}

void PoolAgent::OutputAcknowledged(const wire::Ack& ack) {
  std::lock_guard<std::mutex> lock(mutex_);
  OutputStream& o = output_;
  if (ack.job_id() != o.job || ack.attempt() != o.attempt) return;
  const int64_t held = std::min<int64_t>(ack.offset(), o.base + int64_t(o.pending.size()));
  if (held > o.base) {
    o.pending.erase(0, size_t(held - o.base));
    o.base = held;
  }
  o.in_flight_end = 0;
}

void PoolAgent::Heartbeat(Link& link) {
  link.last_beat = Clock::now();
  wire::Envelope e;
  wire::Heartbeat* beat = e.mutable_heartbeat();
  beat->set_world(self_.world);
  beat->set_rank(self_.rank);
  beat->set_last_log_line(LastLogLine());
  beat->set_rank_token(self_.rank_token);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    beat->set_job_id(job_id_);
    beat->set_attempt(attempt_);
  }
  link.Send(Serialize(e));
}

}  // namespace trainyard
