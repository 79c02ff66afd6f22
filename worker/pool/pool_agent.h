// A worker rank's link to the coordinator in pool mode (the ZeroMQ Guide's Paranoid
// Pirate worker). Torch-free.
//
// One background thread owns the DEALER socket. It heartbeats (naming the job it runs
// and its last log line) and watches its connection with ZMTP heartbeats; after every
// handshake (the first, and each after a drop: no answer for `liveness` periods, or a
// closed peer) it registers the rank, naming the job it still runs, so a restarted
// coordinator re-adopts it and a paused one hears it the moment it resumes (Note [Link
// liveness] in pool_agent.cc). Epoch reports and job results are kept until the
// coordinator acknowledges them and resent after every reconnect: none is lost while
// the coordinator is away, and the coordinator drops the duplicates.
//
// The rank's main thread waits for an assignment, leads it or holds its slot for it
// (Note [Job isolation] in job_process.h) and reports the outcome; it never touches
// the socket.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/curve/curve_keys.h"

namespace trainyard {
namespace wire {
class Ack;
class Assign;
class ListFiles;
class ReadFileChunk;
class Envelope;
class EpochReport;
enum Outcome : int;
}  // namespace wire

struct PoolOptions {
  std::string endpoint;
  int slot = 0;               // this agent's index among its host's slots (the GPU its job ranks use)
  bool under_mpirun = false;  // started by an mpirun (rank_supervisor.h: how it exits)
  double heartbeat_s = 1.0;
  int liveness = 3;
  std::string keys_dir;   // worker.key and coordinator.pub (common/curve/curve_keys.h)
  bool insecure = false;  // no CURVE: for a coordinator started with --insecure
  PeerKeys keys;          // loaded from keys_dir unless insecure
};

// Who this agent is: a pool slot, a world of its own (rank 0 of 1).
struct RankIdentity {
  std::string world, host, device;
  int rank = 0, world_size = 1;
  int slot = 0;  // its index among its host's slots: the GPU a job rank here uses
  int64_t pid = 0;
  // The registration's secrets (Register in trainyard.proto): never logged or shown.
  std::string world_token, rank_token;
};

// Where one job rank runs (wire::JobPlace).
struct JobPlace {
  std::string world;
  int rank = 0;
  std::string host;
  int slot = 0;
};

struct Assignment {
  int64_t job_id = 0;
  int attempt = 0;
  std::string yaml, source, base_dir, runs_dir;
  std::vector<JobPlace> places;  // in job rank order; places[0] leads the job
  bool resume = false;
  int elastic_replicas = 0;  // an elastic attempt's replica, of this many at full strength (Assign)
  int elastic_replica = 0;   // and which of the attempt's replicas it is (its run folder)
};

// How a job rank's part in an attempt ended. The values are the wire's Outcome
// (trainyard.proto), whose generated header no file that includes libtorch may include
// (proto/CMakeLists.txt); pool_agent.cc holds each equal to the wire's of the same name.
enum class JobEnd { kSucceeded = 1, kFailed = 2, kBadInput = 3, kCancelled = 4, kReleased = 5, kPreempted = 8 };
std::string JobEndName(JobEnd end);  // "bad_input": the wire's name (proto/wire_names.h)
wire::Outcome ToWire(JobEnd end);
// A value JobEnd lacks (an attempt-only outcome, a newer peer's) is a failure.
JobEnd JobEndFromWire(wire::Outcome end);

struct JobOutcome {
  JobEnd end = JobEnd::kSucceeded;
  std::string message, summary_json;
};

// The wire's Assign (from the coordinator, or relayed to a job) as an Assignment, and back.
Assignment AssignmentFrom(const wire::Assign& assign);
void ToWire(const Assignment& assignment, wire::Assign* assign);

// Throws std::invalid_argument naming `endpoint` when ZeroMQ cannot connect to it
// (a malformed address; an unreachable coordinator is waited for instead).
void CheckEndpoint(const std::string& endpoint);

class PoolAgent {
 public:
  PoolAgent(PoolOptions options, RankIdentity self);
  ~PoolAgent();
  PoolAgent(const PoolAgent&) = delete;
  PoolAgent& operator=(const PoolAgent&) = delete;

  // Blocks until the coordinator assigns a job, or `stop` becomes true or `timeout_s`
  // passes (nullopt).
  std::optional<Assignment> WaitForAssignment(const std::atomic<bool>& stop, double timeout_s = 1e9);
  // Heartbeats name `assignment` from now on.
  void Begin(const Assignment& assignment);
  // Queues this rank's result (kept until acknowledged); heartbeats say idle again.
  void Finish(const JobOutcome& outcome);
  // Waits up to `timeout_s` for every queued report to be acknowledged.
  bool Drain(double timeout_s);

  // Sends the running job's epoch row on (kept until acknowledged), as this rank's.
  void ReportEpoch(const wire::EpochReport& report);
  // Sends a line of the output of the attempt this rank leads on (Note [Job output] in
  // coordinator/job_output.h): kept until acknowledged, at most kMaxPendingOutputBytes
  // (past that, the oldest lines go). Thread-safe.
  void AppendOutput(const std::string& line);
  // Waits up to `timeout_s` for the output appended so far to be acknowledged.
  bool DrainOutput(double timeout_s);
  // An elastic replica's ReplicaJoin, ReplicaBeat or StepVote (Note [Step quorum] in
  // coordinator/quorum_service.h) from the job this rank leads, sent on as this rank's
  // for the running attempt, once: nothing acknowledges them, and the replica repeats
  // what it gets no answer to. Any other envelope is ignored. Thread-safe.
  void SendToQuorum(const wire::Envelope& message);
  // The coordinator's answers to them (StepDecision, Fenced) for the running attempt
  // since the last call, as envelopes' bytes, oldest first; at most kMaxQuorumAnswers
  // wait (past that, the oldest go). Thread-safe.
  std::vector<std::string> TakeQuorumAnswers();
  // The oldest of them, waiting up to `timeout_s` for one; nullopt if none came.
  // Thread-safe.
  std::optional<std::string> AwaitQuorumAnswer(double timeout_s);
  static constexpr size_t kMaxQuorumAnswers = 64;
  static constexpr size_t kMaxPendingOutputBytes = size_t(4) << 20;
  // True once the coordinator asked to stop the running attempt (or released its slot).
  bool StopRequested() const { return stop_requested_; }
  // Once StopRequested: whether the stop is a preemption (the job checkpoints), and
  // how many seconds the coordinator gives the job to stop (0: the agent's own grace).
  bool StopIsPreemption() const { return stop_preempt_; }
  double StopGrace() const { return stop_grace_s_; }
  const RankIdentity& self() const { return self_; }

 private:
  struct Link;  // the socket and the protocol state the thread owns

  void Loop();
  // One round of the link: read, follow the connection, and while it is up flush the
  // outbox and heartbeat (Note [Link liveness] in pool_agent.cc).
  void Round(Link& link);
  // Registers after each handshake; marks the link down when ZeroMQ drops it.
  void ReadLinkEvents(Link& link);
  // A new socket, connecting; it registers once its handshake succeeds.
  void Connect(Link& link);
  // Names the job still running and resends every unacknowledged report, in order.
  void Register(Link& link);
  void Handle(Link& link, const wire::Envelope& message);
  void FlushOutbox(Link& link);
  void FlushQuorum(Link& link);
  // Keeps a quorum answer for the running attempt (a stale one is dropped).
  void KeepQuorumAnswer(const wire::Envelope& answer, int64_t job, int attempt);
  void FlushOutput(Link& link);
  // Answers about the files of a job's folder (Note [Artifacts] in coordinator/artifacts.h).
  wire::Envelope FilesOf(const wire::ListFiles& ask) const;
  wire::Envelope ChunkOf(const wire::ReadFileChunk& ask) const;
  template <typename Answer>
  void FillSender(int64_t request_id, Answer* out) const;
  void OutputAcknowledged(const wire::Ack& ack);
  void Heartbeat(Link& link);
  void Queue(std::string key, std::string bytes);

  PoolOptions options_;
  RankIdentity self_;
  mutable std::mutex mutex_;
  std::condition_variable assigned_;
  std::deque<Assignment> assignments_;
  int64_t job_id_ = 0;
  int attempt_ = 0;
  // Reliable messages by key, in send order; removed when acknowledged.
  std::vector<std::pair<std::string, std::string>> unacked_;
  std::vector<std::pair<std::string, std::string>> outbox_;  // not yet sent once
  // The running attempt's output on its way (Note [Job output]).
  struct OutputStream {
    int64_t job = 0;
    int attempt = 0;
    int64_t base = 0;           // the offset of pending[0] in the attempt's output
    std::string pending;        // whole lines not yet acknowledged
    int64_t in_flight_end = 0;  // the end of the chunk sent and not yet acknowledged; 0: none
    Clock::time_point sent_at{};
  };
  OutputStream output_;
  std::deque<std::string> quorum_outbox_;  // a replica's messages, not yet sent
  // Its last join or vote, until an answer comes: sent again after a registration, since
  // one sent while the coordinator had let this agent go was refused unanswered.
  std::string quorum_awaiting_;
  int elastic_replica_ = 0;                 // the running assignment's (Assignment::elastic_replica), for its result
  std::deque<std::string> quorum_answers_;  // the coordinator's answers, for the job
  std::condition_variable quorum_answered_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> stop_preempt_{false};
  std::atomic<double> stop_grace_s_{0};
  std::atomic<bool> quitting_{false};
  std::thread thread_;
};

}  // namespace trainyard
