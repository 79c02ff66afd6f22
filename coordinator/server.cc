#include "coordinator/server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <zmq_addon.hpp>

#include "common/atomic_file.h"
#include "common/bounded_json.h"
#include "common/clock.h"
#include "common/csv.h"
#include "common/log_limiter.h"
#include "common/metrics.h"
#include "common/regular_file.h"
#include "common/spec/job_spec.h"
#include "coordinator/search.h"
#include "coordinator/slurm_launcher.h"
#include "proto/wire_names.h"

namespace trainyard {

// Who a request's key acts as, in events: its user, or the role of a key with no name.
std::string Who(const ClientIdentity& client) {
  return client.user.empty() ? std::string("an admin key") : client.user;
}

// A submission's user (Note [Usage]) as kept: login-name characters only, each other
// byte as '?', and at most kMaxUserBytes.
std::string PlainUser(const std::string& user) {
  std::string out = user.substr(0, kMaxUserBytes);
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != '@') c = '?';
  return out;
}

double WallNow() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

double Server::Now() const { return options_.clock ? options_.clock() : WallNow(); }

wire::Envelope ErrorEnvelope(int code, const std::string& message) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  e.mutable_error()->set_code(code);
  e.mutable_error()->set_message(message);
  return e;
}

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      store_(std::make_unique<StateStore>(options_.state_path, options_.fresh)),
      context_(1),
      socket_(context_, zmq::socket_type::router),
      web_socket_(context_, zmq::socket_type::router) {
  options_.runs_dir = std::filesystem::absolute(options_.runs_dir).lexically_normal().string();
  loop_metrics_ = std::make_unique<Metrics>();
  loop_metrics_->DeclareHistogram("trainyard_scheduling_pass_seconds",
                                  "Scheduling passes over a non-empty queue since the coordinator started: from "
                                  "reading the queue to the last assignment sent, on the loop.",
                                  {0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1, 2, 5});
  if (options_.runs_dir.size() > 1 && options_.runs_dir.back() == '/') options_.runs_dir.pop_back();
  CheckRunsDir();
  outputs_ = std::make_unique<OutputFiles>(options_.runs_dir, options_.max_output_bytes);
  if (options_.slurm.enabled) {  // before anything is bound or started: a clear exit 2 without Slurm
    const std::string why = SlurmUnreachable();
    if (!why.empty()) throw ConfigError("--slurm: " + why);
    if (options_.slurm.endpoint.empty()) options_.slurm.endpoint = options_.listen;
    if (options_.slurm.keys_dir.empty())
      options_.slurm.keys_dir = std::filesystem::absolute(options_.keys_dir).lexically_normal().string();
    options_.slurm.insecure = options_.insecure;
  }
  if (options_.slurm.enabled && options_.policy.preemption)
    throw ConfigError("--preemption on is for pools; under --slurm, Slurm's own preemption (PreemptMode) applies");
  if (options_.insecure) {
    spdlog::warn(
        "INSECURE MODE (--insecure): no encryption and no authentication; anyone who can reach {} can submit "
        "jobs and forge worker messages. For development only.",
        options_.listen);
  } else {
    ServerKeys keys = LoadServerKeys(options_.keys_dir);
    MakeCurveServer(socket_, keys);
    zap_ = std::make_unique<ZapHandler>(context_, std::move(keys));
  }
  // ZeroMQ measures a message on the wire, CURVE's box and framing included, and drops
  // the peer of one over its limit without a word. So its limit sits a margin above
  // ours, and HandleFrame refuses what lies between with an answer: a message just
  // under --max-message-bytes is served, one just over it is told why.
  socket_.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes + kWireMarginBytes);
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::router_mandatory, 0);
  socket_.bind(options_.listen);
  web_socket_.set(zmq::sockopt::linger, 0);
  web_socket_.bind(kWebEndpoint);
  parser_ = std::make_unique<SubmitParser>(context_, options_.submit_budget, options_.max_pending_submits);
  started_at_ = Now();
  listening_.Start(started_at_, std::max(options_.heartbeat_s, 0.5));
  // Tokens of worlds no running attempt names and none registered for 30 days go; the
  // rest bind their ids from the first message on (Note [Worlds cannot be squatted]).
  store_->ForgetWorldsRegisteredBefore(started_at_ - kWorldTokenDays * 86400.0);
  ranks_ = std::make_unique<RankRegistry>(
      *store_, listening_,
      RankRegistry::Limits{options_.heartbeat_s * options_.liveness, options_.max_ranks_per_worker_key});
  quorums_ = std::make_unique<ElasticQuorums>(*store_);
  RequeueRunningWithoutAttempt();
  ReloadRunningAttempts();
  LaunchLoop& launch_loop = *this;  // a private base: the launcher reaches the loop only through it
  if (options_.slurm.enabled)
    launcher_ = std::make_unique<SlurmLauncher>(
        options_.slurm, SlurmLauncher::Timing{options_.grace_s, options_.restart_backoff_s},
        SlurmLauncher::Sources{*store_, *ranks_, running_, listening_, launch_loop});
  else
    launcher_ = std::make_unique<PoolLauncher>(
        options_.policy, PoolLauncher::Sources{*store_, *ranks_, running_, *loop_metrics_, waiting_, launch_loop});
  views_ = std::make_unique<JobViews>(
      JobViews::Sources{*store_, *ranks_, running_.all(), waiting_, *outputs_, *loop_metrics_, preemptions_},
      JobViews::Settings{options_.runs_dir, options_.policy.fairshare_half_life_h * 3600.0, options_.slurm.enabled,
                         options_.list_page, options_.heartbeat_s, [this] { return Now(); }});
  SearchLoop& loop = *this;  // a private base: the driver reaches the loop only through it
  searches_ = std::make_unique<SearchDriver>(*store_, *views_, loop, options_.policy.user_max_queued);
}

Server::~Server() = default;

// A runs folder the coordinator cannot write would fail every attempt at its start;
// better to refuse to start at all.
void Server::CheckRunsDir() const {
  namespace fs = std::filesystem;
  const std::string probe = options_.runs_dir + "/.trainyard-write-check";
  try {
    fs::create_directories(options_.runs_dir);
    WriteFileAtomically(probe, "ok\n");  // a file of its own: never a FIFO found there
    fs::remove(probe);
  } catch (const std::exception& e) {
    throw ConfigError("--runs " + options_.runs_dir + " cannot be used: " + e.what());
  }
}

std::string Server::endpoint() const { return socket_.get(zmq::sockopt::last_endpoint); }

void Server::Run(const std::atomic<bool>& stop, std::atomic<bool>* reload_keys) {
  while (!stop) {
    if (reload_keys && reload_keys->exchange(false)) {
      ReloadKeys();
      ++key_reloads_;
    }
    Step(0.1);
  }
}

void Server::Step(double wait_s) {
  zmq::pollitem_t items[] = {{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0},
                             {static_cast<void*>(parser_->ready_socket()), 0, ZMQ_POLLIN, 0},
                             {static_cast<void*>(web_socket_), 0, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, 3, std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000)));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return;  // a signal; the caller decides whether to go on
    throw;
  }
  AdvanceListeningClock(Now());
  // Drain what arrived (bounded, so timers still run under a flood), then the timers.
  for (int i = 0; i < 1000 && (items[0].revents & ZMQ_POLLIN); ++i) {
    ReceiveOne();
    items[0].revents = socket_.get(zmq::sockopt::events) & ZMQ_POLLIN;
  }
  if (items[1].revents & ZMQ_POLLIN) FinishSubmissions();
  if (items[2].revents & ZMQ_POLLIN) AnswerWebQueries();
  try {
    Tick();
  } catch (const std::exception& e) {  // timers never end the daemon; the next tick retries
    spdlog::error("timer work failed: {}", e.what());
  }
}

bool Server::ReloadKeys() {
  if (!zap_) {
    spdlog::warn("keys not re-read: an insecure coordinator (--insecure) admits every peer");
    return false;
  }
  ServerKeys keys;
  try {
    keys = LoadServerKeys(options_.keys_dir);
  } catch (const KeyError& e) {
    spdlog::error("keys not re-read, the allowlists in use are kept: {}", e.what());
    return false;
  }
  // The sockets were bound with the key pair read at start; a new coordinator.key takes
  // a restart (and every peer's copy of its public key).
  const bool own_key_changed = keys.own.public_key != zap_->own_public_key();
  const ZapHandler::Change change = zap_->Replace(std::move(keys));
  spdlog::info(
      "re-read the allowlists in {}: {} worker and {} client keys ({} added, {} removed); connections "
      "already made stay",
      options_.keys_dir, change.workers, change.clients, change.added, change.removed);
  if (own_key_changed) spdlog::warn("{}/coordinator.key changed: it takes effect at a restart", options_.keys_dir);
  return true;
}

void Server::AdvanceListeningClock(double now) {
  const double stall = listening_.Advance(now);
  if (stall == 0) return;
  // After a stall, every rank gets a whole liveness window (and every attempt its start
  // grace) from now: what they sent meanwhile is still queued, and an agent that gave up
  // on us mid-stall is reconnecting.
  spdlog::warn("the coordinator did not run for {:.1f} s; every rank gets a fresh liveness window", stall);
  ranks_->HearAllNow();
  running_.RestartGraces(listening_.Now());
}

void Server::ReceiveOne() {
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    if (!socket_.recv(frames.back(), zmq::recv_flags::dontwait)) {
      frames.pop_back();
      break;
    }
  } while (frames.back().more());
  // [identity, payload] from a DEALER, or [identity, empty, payload] from a REQ.
  if (frames.size() == 3 && frames[1].size() == 0) frames.erase(frames.begin() + 1);
  if (frames.size() != 2) {
    ++bad_frames_;
    if (int64_t left_out = 0; log_limiter_.Allow("frames", SteadySeconds(), &left_out))
      spdlog::warn("dropped a message of {} frames (expected 2); {} bad so far{}", frames.size(), bad_frames_,
                   LeftOutNote(left_out));
    if (!frames.empty()) Reply(frames[0], ErrorEnvelope(2, "expected one protobuf Envelope frame"));
    return;
  }
  const char* role = zmq_msg_gets(frames[1].handle(), "User-Id");  // set by the ZAP handler
  HandleFrame(std::string(static_cast<const char*>(frames[0].data()), frames[0].size()), role ? role : "",
              frames[1].data(), frames[1].size());
}

void Server::HandleFrame(const std::string& identity, const std::string& role, const void* data, size_t size) {
  if (size > static_cast<size_t>(options_.max_message_bytes)) {
    ++bad_frames_;
    Send(identity, ErrorEnvelope(2, "a message of " + std::to_string(size) + " bytes is over the coordinator's " +
                                        std::to_string(options_.max_message_bytes) + " (--max-message-bytes)"));
    return;
  }
  wire::Envelope request;
  if (size > static_cast<size_t>(INT_MAX) || !request.ParseFromArray(data, static_cast<int>(size)) ||
      request.body_case() == wire::Envelope::BODY_NOT_SET) {
    ++bad_frames_;
    if (int64_t left_out = 0; log_limiter_.Allow("envelope", SteadySeconds(), &left_out))
      spdlog::warn("dropped a frame that is not a trainyard Envelope ({} bytes); {} bad so far{}", size, bad_frames_,
                   LeftOutNote(left_out));
    Send(identity, ErrorEnvelope(2, "the message is not a valid trainyard Envelope"));
    return;
  }
  if (request.version() != kProtocolVersion) {
    Send(identity,
         ErrorEnvelope(2, "protocol version " + std::to_string(request.version()) +
                              " is not supported (this coordinator speaks " + std::to_string(kProtocolVersion) + ")"));
    return;
  }
  std::string wire_role;
  ClientIdentity client;  // without CURVE (--insecure) everyone is an admin
  ParseZapUserId(role, &wire_role, &client);
  const std::string refusal = RoleRefusal(wire_role, request);
  if (!refusal.empty()) {
    Refuse(identity, refusal);
    return;
  }
  BoundPeerText(&request);
  try {
    if (auto reply = Dispatch(identity, client, request)) Send(identity, *reply);
  } catch (const std::exception& e) {  // a failed request never ends the daemon
    if (int64_t left_out = 0; log_limiter_.Allow("failed", SteadySeconds(), &left_out))
      spdlog::error("request failed: {}{}", e.what(), LeftOutNote(left_out));
    Send(identity, ErrorEnvelope(1, e.what()));
  }
}

std::string Server::RoleRefusal(const std::string& role, const wire::Envelope& request) const {
  if (options_.insecure) return "";
  const bool worker_message = request.has_register_() || request.has_heartbeat() || request.has_epoch() ||
                              request.has_result() || request.has_rank_exit() || request.has_output() ||
                              request.has_file_list() || request.has_file_chunk() || request.has_replica_join() ||
                              request.has_replica_beat() || request.has_step_vote();
  const char* needed = ToString(worker_message ? WireRole::kWorker : WireRole::kClient);
  if (role == needed) return "";
  return "a " + (role.empty() ? std::string("key without a role") : role + " key") + " cannot send " +
         (worker_message ? "worker messages" : "client requests");
}

void Server::Refuse(const std::string& identity, const std::string& why) {
  ++refused_messages_;
  if (int64_t left_out = 0; log_limiter_.Allow("refused", SteadySeconds(), &left_out))
    spdlog::warn("refused a message: {}; {} refused so far{}", why, refused_messages_, LeftOutNote(left_out));
  Send(identity, ErrorEnvelope(2, "refused: " + why));
}

void Server::Reply(const zmq::message_t& identity, const wire::Envelope& reply) {
  Send(std::string(static_cast<const char*>(identity.data()), identity.size()), reply);
}

void Server::Send(const std::string& identity, const wire::Envelope& message) {
  wire::Envelope copy = message;
  copy.set_version(kProtocolVersion);
  if (options_.outbox) return options_.outbox(identity, copy);
  std::string bytes = copy.SerializeAsString();
  socket_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
}

std::optional<wire::Envelope> Server::Dispatch(const std::string& identity, const ClientIdentity& client,
                                               const wire::Envelope& request) {
  switch (request.body_case()) {
    case wire::Envelope::kRegister:
      OnRegister(identity, client.user, request.register_());  // a worker's `user` is its key
      return std::nullopt;
    case wire::Envelope::kHeartbeat:
      OnHeartbeat(identity, request.heartbeat());
      return std::nullopt;
    case wire::Envelope::kEpoch:
      OnEpoch(identity, request.epoch());
      return std::nullopt;
    case wire::Envelope::kResult:
      OnResult(identity, request.result());
      return std::nullopt;
    case wire::Envelope::kRankExit:
      OnRankExit(identity, request.rank_exit());
      return std::nullopt;
    case wire::Envelope::kOutput:
      OnOutput(identity, request.output());
      return std::nullopt;
    case wire::Envelope::kFileList:
      OnFileList(identity, request.file_list());
      return std::nullopt;
    case wire::Envelope::kFileChunk:
      OnFileChunk(identity, request.file_chunk());
      return std::nullopt;
    case wire::Envelope::kReplicaJoin:
      OnReplicaJoin(identity, request.replica_join());
      return std::nullopt;
    case wire::Envelope::kReplicaBeat:
      OnReplicaBeat(identity, request.replica_beat());
      return std::nullopt;
    case wire::Envelope::kStepVote:
      OnStepVote(identity, request.step_vote());
      return std::nullopt;
    case wire::Envelope::kArtifacts:
      return Artifacts(identity, client, request.artifacts());
    case wire::Envelope::kFetch:
      return Fetch(identity, client, request.fetch());
    case wire::Envelope::kSubmit:
      return Submit(identity, client, request.submit());
    default:
      return Handle(client, request);
  }
}

wire::Envelope Server::Handle(const ClientIdentity& client, const wire::Envelope& request) {
  switch (request.body_case()) {
    case wire::Envelope::kList:
      return views_->List(request.list());
    case wire::Envelope::kStatus:
      return views_->Status(request.status().job_id());
    case wire::Envelope::kCancel:
      return Cancel(request.cancel().job_id(), client);
    case wire::Envelope::kLogs:
      return views_->Logs(request.logs());
    case wire::Envelope::kReport:
      return views_->Report(request.report().job_id());
    case wire::Envelope::kWorkers:
      return views_->Workers();
    case wire::Envelope::kUsage:
      return views_->UsageReport(request.usage().per_user());
    default:
      return ErrorEnvelope(2, "this coordinator does not accept that message");
  }
}

// Parsed on the SubmitParser's thread; answered by FinishSubmission. A named key's jobs
// are its user's, whatever jobctl said (Note [Client keys name users]).
std::optional<wire::Envelope> Server::Submit(const std::string& identity, const ClientIdentity& client,
                                             const wire::SubmitRequest& request) {
  wire::SubmitRequest owned = request;
  if (!client.user.empty()) owned.set_user(client.user);
  if (owned.idempotency_key().size() > kMaxIdempotencyKeyBytes)
    return ErrorEnvelope(2, "an idempotency key (--key) is at most " + std::to_string(kMaxIdempotencyKeyBytes) +
                                " bytes; this one is " + std::to_string(owned.idempotency_key().size()));
  // A user whose queue is full is refused before the file is parsed (a resend of a job
  // already queued is not a new one).
  const std::string user = PlainUser(owned.user());
  if (options_.policy.user_max_queued > 0 && !store_->FindByKey(user, owned.idempotency_key()))
    if (const std::string full = QueueFullRefusal(user); !full.empty()) return ErrorEnvelope(2, "refused: " + full);
  if (parser_->Post(identity, owned, client.admin)) return std::nullopt;
  return ErrorEnvelope(1, "the coordinator is busy: " + std::to_string(options_.max_pending_submits) +
                              " submissions are being checked; retry shortly");
}

void Server::FinishSubmissions() {
  for (const ParsedSubmission& parsed : parser_->TakeDone()) {
    try {
      FinishSubmission(parsed);
    } catch (const std::exception& e) {
      spdlog::error("submission failed: {}", e.what());
      Send(parsed.identity, ErrorEnvelope(1, e.what()));
    }
  }
}

void Server::FinishSubmission(const ParsedSubmission& parsed) {
  if (parsed.search) return FinishSearchSubmission(parsed);
  if (!parsed.spec) {
    Send(parsed.identity, ErrorEnvelope(2, parsed.error));  // rejected before anything is written
    return;
  }
  const JobSpec& spec = *parsed.spec;
  const wire::SubmitRequest& request = parsed.request;
  if (const std::string refusal = ElasticRefusal(spec, request.source()); !refusal.empty()) {
    Send(parsed.identity, ErrorEnvelope(2, refusal));
    return;
  }
  const NewJob job = JobOf(spec, request);
  if (const std::string refusal = PolicyRefusal(parsed.admin, job.priority, job.preemptible); !refusal.empty()) {
    Send(parsed.identity, ErrorEnvelope(2, "refused: " + refusal));
    return;
  }
  const std::string over_quota = QuotaRefusal(job.user, job.ranks);
  bool created = false;
  StateStore::Transaction transaction(*store_);
  JobRecord record = store_->Submit(job, Now(), &created);
  if (created && !over_quota.empty()) {  // rolled back: a refused submission changes nothing
    Send(parsed.identity, ErrorEnvelope(2, "refused: " + over_quota));
    return;
  }
  if (!created && record.spec_yaml != job.spec_yaml) {
    Send(parsed.identity, ErrorEnvelope(2, KeyReuseRefusal(job.idempotency_key, record)));
    return;
  }
  if (created)
    store_->AddEvent(record.id,
                     "submitted by " + (record.user.empty() ? std::string("an unnamed user") : record.user) +
                         " (priority " + std::to_string(record.priority) + ", " + std::to_string(record.ranks) +
                         " ranks" + (record.preemptible ? "" : ", not preemptible") + ")",
                     record.submitted_at);
  transaction.Commit();  // before the reply
  schedule_due_ = schedule_due_ || created;
  if (created)
    spdlog::info("job {} '{}' queued ({} ranks, priority {})", record.id, record.name, record.ranks, record.priority);
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  reply.mutable_submitted()->set_job_id(record.id);
  reply.mutable_submitted()->set_created(created);
  Send(parsed.identity, reply);
}

// The job `spec` (submitted as `request`) becomes in the store.
NewJob Server::JobOf(const JobSpec& spec, const wire::SubmitRequest& request) {
  NewJob job;
  job.name = spec.name;
  job.idempotency_key = request.idempotency_key();
  job.spec_yaml = request.yaml();
  job.source = request.source();
  job.device = spec.resources.device;
  job.priority = spec.resources.priority;
  job.ranks = spec.resources.ranks;
  if (const ElasticSpec& elastic = spec.distributed.elastic; elastic.enabled()) {  // a gang of its replicas
    job.ranks = elastic.max_replicas * spec.resources.ranks;                       // every replica's ranks
    job.elastic = {elastic.min_replicas, elastic.max_replicas, elastic.join_window_s, spec.distributed.timeout_s};
  }
  job.max_restarts = spec.resources.max_restarts;
  job.base_dir = request.base_dir();
  job.estimate_s = spec.resources.estimate_minutes * 60.0;
  job.user = PlainUser(request.user());
  job.preemptible = spec.resources.preemptible;
  job.metric = spec.checkpoint.best_metric;
  return job;
}

std::string Server::ElasticRefusal(const JobSpec& spec, const std::string& source) const {
  if (!spec.distributed.elastic.enabled() || spec.resources.ranks == 1 || options_.slurm.enabled) return "";
  return source +
         ": resources.ranks: a pool's elastic replica is one rank (resources.ranks: 1); a replica of several ranks "
         "runs under coordinator --slurm, each a Slurm job of its ranks on one node";
}

std::string Server::PolicyRefusal(bool admin, int priority, bool preemptible) const {
  if (admin) return "";
  const int most = options_.policy.user_max_priority;
  if (priority > most)
    return "priority " + std::to_string(priority) + " is above --user-max-priority " + std::to_string(most) +
           ", the most a user key may ask; an admin key (--client-role admin) may ask more";
  if (!preemptible)
    return "preemptible: false is for admin keys (--client-role admin); a user key's jobs may always be preempted "
           "by higher priorities";
  return "";
}

std::string KeyReuseRefusal(const std::string& key, const JobRecord& existing) {
  return "idempotency key '" + key + "' already names job " + std::to_string(existing.id) + " ('" + existing.name +
         "'), submitted with another file; a resend must carry the same file: give a new --key, or none";
}

std::string Server::QuotaRefusal(const std::string& user, int ranks) const {
  const int max_ranks = options_.policy.user_max_ranks;
  if (max_ranks > 0 && ranks > max_ranks)
    return "the job needs " + std::to_string(ranks) + " ranks, more than one user may run at once (--user-max-ranks " +
           std::to_string(max_ranks) + ")";
  return QueueFullRefusal(user);
}

std::string Server::QueueFullRefusal(const std::string& user) const {
  const int limit = options_.policy.user_max_queued;
  if (limit <= 0) return "";
  const int mine = QueuedJobsOf(user);
  if (mine < limit) return "";
  return "user " + (user.empty() ? std::string("''") : user) + " has " + std::to_string(mine) +
         " jobs queued, the most --user-max-queued allows (" + std::to_string(limit) + ")";
}

std::string Server::SearchQuotaRefusal(const std::string& user, int concurrent, int ranks) const {
  const int max_ranks = options_.policy.user_max_ranks;
  const int64_t at_once = int64_t(concurrent) * ranks;
  if (max_ranks > 0 && at_once > max_ranks)
    return "the search runs up to " + std::to_string(concurrent) + " trials of up to " + std::to_string(ranks) +
           " ranks at once (" + std::to_string(at_once) + " ranks), more than one user may run (--user-max-ranks " +
           std::to_string(max_ranks) + "); lower max_concurrent";
  const int limit = options_.policy.user_max_queued;
  if (limit <= 0) return "";
  const int mine = QueuedJobsOf(user);
  if (mine + concurrent <= limit) return "";
  return "user " + (user.empty() ? std::string("''") : user) + " has " + std::to_string(mine) +
         " jobs queued and the search queues up to " + std::to_string(concurrent) +
         " trials at once (max_concurrent); --user-max-queued allows " + std::to_string(limit);
}

int Server::QueuedJobsOf(const std::string& user) const {
  const auto& queued = store_->Queued();
  return static_cast<int>(
      std::count_if(queued.begin(), queued.end(), [&](const auto& entry) { return entry.second.user == user; }));
}

wire::Envelope Server::Cancel(int64_t id, const ClientIdentity& client) {
  auto job = store_->Find(id);
  if (!job) return ErrorEnvelope(2, "no job " + std::to_string(id));
  if (!client.admin && job->user != client.user)
    return ErrorEnvelope(2, "refused: job " + std::to_string(id) + " belongs to " +
                                (job->user.empty() ? std::string("no named user") : job->user) +
                                "; only its owner "
                                "or an admin may cancel it, and " +
                                client.user + " is neither");
  if (job->is_search) {
    searches_->Cancel(*job, client, Who(client), Now());
    return views_->Status(id);
  }
  const double now = Now();
  if (job->state == JobState::kQueued) {
    StateStore::Transaction transaction(*store_);
    store_->SetState(id, JobState::kCancelled, "cancelled while queued by " + Who(client), now);
    store_->AddEvent(id, "cancelled while queued by " + Who(client), now);
    transaction.Commit();
    spdlog::info("job {} cancelled", id);
  } else if (job->state == JobState::kRunning) {
    EndJobsAttempt(
        id, {wire::OUTCOME_CANCELLED, "", JobState::kCancelled, "cancelled while running by " + Who(client), 0,
             "cancelled while running by " + Who(client) + "; its ranks were told to stop", "cancelled by the user"});
    spdlog::info("job {} cancelled while running", id);
  }
  if (job->search != 0) searches_->MarkDue();
  return views_->Status(id);
}

void Server::AnswerWebQueries() {
  for (int i = 0; i < 100; ++i) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(web_socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
    if (frames.size() != 2) continue;  // [asker][target]: only DashboardServer speaks here
    const WebReply reply = AnswerWebQuery(frames[1].to_string());
    const std::string status = std::to_string(reply.status);
    std::array<zmq::const_buffer, 4> out = {zmq::buffer(frames[0].data(), frames[0].size()), zmq::buffer(status),
                                            zmq::buffer(reply.content_type), zmq::buffer(reply.body)};
    zmq::send_multipart(web_socket_, out, zmq::send_flags::dontwait);
  }
}

}  // namespace trainyard
