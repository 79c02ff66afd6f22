#include "worker/pool/job_relay.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "proto/wire_names.h"
#include "proto/wire_version.h"
#include "trainyard.pb.h"

namespace trainyard {
namespace {

constexpr int64_t kMaxRelayBytes = 64 << 20;  // an Assign carries a job file

std::string Serialize(wire::Envelope envelope) {
  envelope.set_version(kProtocolVersion);
  return envelope.SerializeAsString();
}

std::string TempRoot() {
  std::error_code error;
  const std::filesystem::path root = std::filesystem::temp_directory_path(error);
  return error ? "/tmp" : root.string();
}

// A signal (EINTR) ends the wait early; the callers loop.
void WaitForInput(zmq::socket_t& socket, int timeout_ms) {
  zmq::pollitem_t items[] = {{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
  }
}

bool IsQuorumAnswer(const wire::Envelope& e) { return e.has_step_decision() || e.has_fenced(); }

}  // namespace

struct JobRelay::Socket {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::pair};
};

struct RelayClient::Socket {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::pair};
};

JobRelay::JobRelay() : socket_(std::make_unique<Socket>()) {
  std::string folder = TempRoot() + "/trainyard-job-XXXXXX";
  if (!::mkdtemp(folder.data()))  // made 0700
    throw std::runtime_error("cannot make a folder for the job's relay under " + TempRoot() + ": " +
                             std::strerror(errno));
  folder_ = folder;
  endpoint_ = "ipc://" + folder_ + "/relay";
  socket_->socket.set(zmq::sockopt::linger, 0);
  socket_->socket.set(zmq::sockopt::maxmsgsize, kMaxRelayBytes);
  try {
    socket_->socket.bind(endpoint_);
  } catch (const zmq::error_t& e) {
    std::filesystem::remove_all(folder_);
    throw std::runtime_error("cannot bind the job's relay at " + endpoint_ + ": " + e.what());
  }
}

JobRelay::~JobRelay() {
  socket_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(folder_, ignored);
}

void JobRelay::Pump(int timeout_ms, const Assignment& assignment, PoolAgent& agent) {
  WaitForInput(socket_->socket, timeout_ms);
  for (zmq::message_t frame; socket_->socket.recv(frame, zmq::recv_flags::dontwait);) {
    wire::Envelope in;
    if (!in.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) continue;
    if (in.has_started()) {
      processes_.clear();
      for (const wire::RankInfo& rank : in.started().ranks()) processes_.push_back({rank.pid(), rank.host()});
      wire::Envelope out;
      ToWire(assignment, out.mutable_assign());
      socket_->socket.send(zmq::buffer(Serialize(out)), zmq::send_flags::dontwait);
    } else if (in.has_epoch()) {
      agent.ReportEpoch(in.epoch());
    } else if (in.has_result()) {
      result_ = JobOutcome{JobEndFromWire(in.result().end()), in.result().message(), in.result().summary_json()};
      wire::Envelope ack;
      ack.mutable_ack()->set_what("result");
      socket_->socket.send(zmq::buffer(Serialize(ack)), zmq::send_flags::dontwait);
    } else if (in.has_replica_join() || in.has_replica_beat() || in.has_step_vote()) {
      agent.SendToQuorum(in);
    }
  }
  for (const std::string& answer : agent.TakeQuorumAnswers())
    socket_->socket.send(zmq::buffer(answer), zmq::send_flags::dontwait);
}

void JobRelay::Stop(const std::string& reason, const Assignment& assignment, bool preempt) {
  if (stop_sent_) return;
  wire::Envelope e;
  e.mutable_stop()->set_job_id(assignment.job_id);
  e.mutable_stop()->set_attempt(assignment.attempt);
  e.mutable_stop()->set_reason(reason);
  e.mutable_stop()->set_preempt(preempt);
  // Fails (EAGAIN) until the job's rank 0 has connected; the caller asks again.
  stop_sent_ = socket_->socket.send(zmq::buffer(Serialize(e)), zmq::send_flags::dontwait).has_value();
}

RelayClient::RelayClient(const std::string& endpoint) : socket_(std::make_unique<Socket>()) {
  socket_->socket.set(zmq::sockopt::linger, 1000);
  socket_->socket.set(zmq::sockopt::maxmsgsize, kMaxRelayBytes);
  socket_->socket.connect(endpoint);
}

RelayClient::~RelayClient() = default;

std::optional<wire::Envelope> RelayClient::AwaitLocked(double timeout_s, bool (*wanted)(const wire::Envelope&)) const {
  const auto start = Clock::now();
  for (;;) {
    for (zmq::message_t frame; socket_->socket.recv(frame, zmq::recv_flags::dontwait);) {
      wire::Envelope in;
      if (!in.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) continue;
      if (in.has_stop()) {
        stop_requested_ = true;
        preempt_requested_ = preempt_requested_ || in.stop().preempt();
      }
      if (wanted && wanted(in)) return in;
      if (IsQuorumAnswer(in)) {  // kept for AwaitQuorumAnswer, whatever waits now
        quorum_answers_.push_back(in.SerializeAsString());
        if (quorum_answers_.size() > PoolAgent::kMaxQuorumAnswers) quorum_answers_.pop_front();
      }
    }
    if (SecondsSince(start) >= timeout_s) return std::nullopt;
    WaitForInput(socket_->socket, 50);
  }
}

void RelayClient::SendQuorumMessage(const wire::Envelope& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  socket_->socket.send(zmq::buffer(Serialize(message)), zmq::send_flags::none);
}

std::optional<wire::Envelope> RelayClient::AwaitQuorumAnswer(double timeout_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (quorum_answers_.empty()) return AwaitLocked(timeout_s, IsQuorumAnswer);
  wire::Envelope answer;
  answer.ParseFromString(quorum_answers_.front());  // parsed once already
  quorum_answers_.pop_front();
  return answer;
}

std::string RelayClient::Start(const std::vector<JobRankProcess>& processes, double timeout_s) {
  wire::Envelope hello;
  for (size_t i = 0; i < processes.size(); ++i) {
    wire::RankInfo* rank = hello.mutable_started()->add_ranks();
    rank->set_rank(static_cast<int>(i));
    rank->set_pid(processes[i].pid);
    rank->set_host(processes[i].host);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  socket_->socket.send(zmq::buffer(Serialize(hello)), zmq::send_flags::none);
  const auto reply = AwaitLocked(timeout_s, [](const wire::Envelope& e) { return e.has_assign(); });
  if (reply) return reply->assign().SerializeAsString();
  throw std::runtime_error("the pool agent that launched this job sent no assignment within " +
                           std::to_string(int(timeout_s)) + " s");
}

namespace {

void FillEpochReport(const EpochRow& row, const std::string& csv_header, const std::string& csv_line,
                     wire::EpochReport* report) {
  report->set_epoch(static_cast<int32_t>(row.epoch));
  report->set_csv_header(csv_header);
  report->set_csv_line(csv_line);
  wire::StepBreakdown* breakdown = report->mutable_breakdown();
  for (int i = 0; i < kNumStepParts; ++i) {
    wire::StepPart* part = breakdown->add_parts();
    part->set_name(kStepParts[i]);
    part->set_min_ms(row.parts[i].min);
    part->set_median_ms(row.parts[i].median);
    part->set_max_ms(row.parts[i].max);
  }
  breakdown->set_slowest_rank(row.slowest_rank);
  breakdown->set_slowest_ms_per_step(row.slowest_ms_per_step);
  for (const auto& parts : row.rank_parts) {
    wire::RankParts* rank = breakdown->add_ranks();
    for (double ms : parts) rank->add_ms(ms);
  }
}

}  // namespace

void RelayClient::EpochDone(const EpochRow& row, const std::string& csv_header, const std::string& csv_line) {
  wire::Envelope e;
  FillEpochReport(row, csv_header, csv_line, e.mutable_epoch());
  std::lock_guard<std::mutex> lock(mutex_);
  socket_->socket.send(zmq::buffer(Serialize(e)), zmq::send_flags::none);
}

void AgentHooks::EpochDone(const EpochRow& row, const std::string& csv_header, const std::string& csv_line) {
  wire::EpochReport report;
  FillEpochReport(row, csv_header, csv_line, &report);
  agent_.ReportEpoch(report);
}

std::optional<wire::Envelope> AgentQuorumChannel::AwaitQuorumAnswer(double timeout_s) {
  const std::optional<std::string> bytes = agent_.AwaitQuorumAnswer(timeout_s);
  if (!bytes) return std::nullopt;
  wire::Envelope answer;
  answer.ParseFromString(*bytes);  // the agent parsed it once already
  return answer;
}

bool RelayClient::StopRequested() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stop_requested_) AwaitLocked(0, nullptr);
  return stop_requested_;
}

bool RelayClient::PreemptRequested() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stop_requested_) AwaitLocked(0, nullptr);
  return preempt_requested_;
}

bool RelayClient::SendResult(const JobOutcome& outcome, double timeout_s) {
  wire::Envelope e;
  wire::JobResult* result = e.mutable_result();
  result->set_end(ToWire(outcome.end));
  result->set_message(outcome.message);
  result->set_summary_json(outcome.summary_json);
  std::lock_guard<std::mutex> lock(mutex_);
  socket_->socket.send(zmq::buffer(Serialize(e)), zmq::send_flags::none);
  return AwaitLocked(timeout_s, [](const wire::Envelope& in) { return in.has_ack(); }).has_value();
}

void RelayClient::Aborting(const std::string& error) {
  wire::Envelope e;
  wire::JobResult* result = e.mutable_result();
  result->set_end(wire::OUTCOME_FAILED);
  result->set_message(error);
  std::lock_guard<std::mutex> lock(mutex_);
  // Queued here, the message leaves on ZeroMQ's I/O thread while the caller goes on: the
  // communicator answers its peers for a second before MPI_Abort ends the process, which
  // closes no socket (so linger plays no part).
  if (!socket_->socket.send(zmq::buffer(Serialize(e)), zmq::send_flags::dontwait))
    LogWarn("the pool agent's relay is full: the job's failure goes unsaid, and its mpirun's words must end it");
}

std::string AssignmentBytes(const Assignment& assignment) {
  wire::Assign a;
  ToWire(assignment, &a);
  return a.SerializeAsString();
}

Assignment ParseAssignment(const std::string& bytes) {
  wire::Assign a;
  if (bytes.empty() || !a.ParseFromString(bytes)) throw std::invalid_argument("not an assignment");
  return AssignmentFrom(a);
}

}  // namespace trainyard
