// The private line between a pool agent that leads a job (Note [Job isolation] in
// job_process.h) and the job's rank 0. Torch-free; the wire stays inside the .cc.
//
// The agent binds a ZeroMQ PAIR socket at ipc://<a fresh 0700 folder>/relay, so only
// processes of the same user can reach it, and passes its address on the job's
// command line. The exchange, in wire::Envelope messages:
//   job rank 0 -> agent   JobStarted (every job rank's pid and host), once MPI is up
//   agent -> job          the Assign (job file, attempt, runs folder, resume)
//   job -> agent          an EpochReport per finished epoch (the agent adds who it is
//                         and sends it on to the coordinator, reliably)
//   agent -> job          StopJob, when the coordinator asks (cancel, a stale attempt)
//   job -> agent          the JobResult of rank 0, answered with an Ack
//   job -> agent          an elastic replica's ReplicaJoin, ReplicaBeat and StepVote
//                         (the agent signs them as its rank's and sends them on);
//                         agent -> job: the coordinator's StepDecision and Fenced
// The job's other ranks get the assignment from rank 0 (MPI_Bcast) and never touch
// the socket. Whatever the job does not say (it crashed, or was killed), the agent
// learns from its mpirun (job_process.h).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker/pool/pool_agent.h"
#include "worker/report/job_hooks.h"

namespace trainyard {

// One process of a running job, as its rank 0 tells the agent.
struct JobRankProcess {
  int64_t pid = 0;
  std::string host;
};

// The agent's end. Not thread-safe: the agent's main loop owns it.
class JobRelay {
 public:
  // Throws std::runtime_error when the folder or the socket cannot be made.
  JobRelay();
  ~JobRelay();  // closes the socket and removes the folder
  JobRelay(const JobRelay&) = delete;
  JobRelay& operator=(const JobRelay&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  // Handles what the job sent (waiting up to `timeout_ms` for it): answers JobStarted
  // with `assignment`, hands epoch reports to `agent`, keeps the result.
  void Pump(int timeout_ms, const Assignment& assignment, PoolAgent& agent);
  // Relays a stop request to the job, once it is connected; call again until it is
  // (later calls after the first delivery do nothing).
  void Stop(const std::string& reason, const Assignment& assignment, bool preempt);

  const std::vector<JobRankProcess>& processes() const { return processes_; }
  const std::optional<JobOutcome>& result() const { return result_; }

 private:
  struct Socket;
  std::string folder_, endpoint_;
  std::unique_ptr<Socket> socket_;
  std::vector<JobRankProcess> processes_;
  std::optional<JobOutcome> result_;
  bool stop_sent_ = false;
};

// Where an elastic replica's messages for the coordinator's quorum go and its answers
// come from (RelayQuorumLink in relay_quorum_link.h speaks through one): the relay to
// the agent that leads the job (RelayClient), or, in a Slurm job's rank 0, that rank's
// own agent (AgentQuorumChannel).
class QuorumChannel {
 public:
  virtual ~QuorumChannel() = default;
  // A ReplicaJoin, ReplicaBeat or StepVote, sent once; the agent signs it as its rank's.
  virtual void SendQuorumMessage(const wire::Envelope& message) = 0;
  // The next answer from the quorum (StepDecision or Fenced), oldest first, waiting up
  // to `timeout_s`; nullopt if none came.
  virtual std::optional<wire::Envelope> AwaitQuorumAnswer(double timeout_s) = 0;
};

// The job's end, on its rank 0: the job's JobHooks. Thread-safe.
class RelayClient : public JobHooks, public QuorumChannel {
 public:
  // Connects to the agent at `endpoint`.
  explicit RelayClient(const std::string& endpoint);
  ~RelayClient() override;
  RelayClient(const RelayClient&) = delete;
  RelayClient& operator=(const RelayClient&) = delete;

  // Tells the agent which processes run the job and returns the assignment as bytes
  // (for the other ranks; see ParseAssignment). Throws std::runtime_error when none
  // comes within `timeout_s`.
  std::string Start(const std::vector<JobRankProcess>& processes, double timeout_s);
  void EpochDone(const EpochRow& row, const std::string& csv_header, const std::string& csv_line) override;
  bool StopRequested() const override;
  bool PreemptRequested() const override;
  // Queues a "failed" result with `error` and returns without waiting for the agent's Ack
  // (the process aborts next; the agent then ends the job within its abort grace).
  void Aborting(const std::string& error) override;
  // Sends rank 0's outcome and waits up to `timeout_s` for the agent to have it.
  bool SendResult(const JobOutcome& outcome, double timeout_s);
  // An elastic replica's quorum messages, through the agent.
  void SendQuorumMessage(const wire::Envelope& message) override;
  std::optional<wire::Envelope> AwaitQuorumAnswer(double timeout_s) override;

 private:
  struct Socket;
  std::unique_ptr<Socket> socket_;
  mutable std::mutex mutex_;
  mutable bool stop_requested_ = false;
  mutable bool preempt_requested_ = false;
  // Quorum answers (envelopes' bytes) that came while something else was awaited.
  mutable std::deque<std::string> quorum_answers_;
  // Reads what the agent sent, noting stop requests, until a message `wanted` accepts
  // (returned) or `timeout_s` has passed (nullopt; 0: what has arrived, no waiting).
  // REQUIRES: mutex_ held.
  std::optional<wire::Envelope> AwaitLocked(double timeout_s, bool (*wanted)(const wire::Envelope&)) const;
};

// The bytes RelayClient::Start returns, back into an Assignment. Throws
// std::invalid_argument when they are not one.
Assignment ParseAssignment(const std::string& bytes);
// An Assignment as such bytes (for a job rank 0 that got it itself, to pass on).
std::string AssignmentBytes(const Assignment& assignment);

// The hooks of a job whose rank 0 is itself the coordinator's rank, with no agent in
// between (an attempt run as a Slurm job: Note [Attempts as Slurm jobs] in
// coordinator/slurm.h): epoch rows go to `agent`, its stop requests come in.
class AgentHooks : public JobHooks {
 public:
  explicit AgentHooks(PoolAgent& agent) : agent_(agent) {}
  void EpochDone(const EpochRow& row, const std::string& csv_header, const std::string& csv_line) override;
  bool StopRequested() const override { return agent_.StopRequested(); }
  bool PreemptRequested() const override { return agent_.StopRequested() && agent_.StopIsPreemption(); }

 private:
  PoolAgent& agent_;
};

// An elastic replica's quorum channel in a process that is itself the coordinator's
// rank (a Slurm job's rank 0): its messages go out through `agent`, signed as its rank's.
class AgentQuorumChannel : public QuorumChannel {
 public:
  explicit AgentQuorumChannel(PoolAgent& agent) : agent_(agent) {}
  void SendQuorumMessage(const wire::Envelope& message) override { agent_.SendToQuorum(message); }
  std::optional<wire::Envelope> AwaitQuorumAnswer(double timeout_s) override;

 private:
  PoolAgent& agent_;
};

// Hooks for the job's other ranks: no reports, no stop requests of their own (rank 0's
// vote carries the agent's; Note [Stop agreement] in job_setup.h).
class SilentHooks : public JobHooks {
 public:
  void EpochDone(const EpochRow&, const std::string&, const std::string&) override {}
  bool StopRequested() const override { return false; }
};

}  // namespace trainyard
