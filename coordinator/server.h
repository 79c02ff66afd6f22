// The coordinator daemon: one ZeroMQ ROUTER socket serving jobctl and worker ranks
// with protobuf Envelopes, over the SQLite state store.
//
// One thread owns the socket, the store, the worker registry and every running
// attempt. A frame that does not parse is counted and dropped, with an ErrorReply
// where the sender is known; no input can end the loop. Messages over
// `max_message_bytes` are refused by ZeroMQ itself (ZMQ_MAXMSGSIZE), which drops that
// peer's connection.
//
// Worker pools (server_pool.cc), per the ZeroMQ Guide's Paranoid Pirate: each rank
// registers and heartbeats; the coordinator pulses every registered rank. A rank
// silent for `liveness` heartbeats is gone, and so is any attempt it was part of.
// Life of an attempt: Assign to every rank of the placement -> epoch reports from the
// job's rank 0 -> a JobResult from every rank. It fails on the first failing result,
// a RankExit from a rank's supervisor (naming the exit code or signal), a lost rank,
// or ranks that never start it; a failed job is requeued (resuming from its last
// checkpoint) after a backoff, until resources.max_restarts is spent.
//
// After a restart the running attempts are reloaded from the store and wait up to
// `grace_s` for their ranks to re-register naming them; reports resent by the workers
// are deduplicated by (job, epoch).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "coordinator/scheduler.h"
#include "coordinator/state_store.h"
#include "proto/wire_version.h"
#include "trainyard.pb.h"

namespace trainyard {

struct ServerOptions {
  std::string listen = "tcp://127.0.0.1:5555";
  std::string state_path = "trainyard.db";
  std::string runs_dir = "runs";
  bool fresh = false;
  int64_t max_message_bytes = 16 << 20;
  double heartbeat_s = 1.0;      // pulse period, and the period workers are expected to keep
  int liveness = 3;              // heartbeats a rank may miss before it is gone
  double grace_s = 30;           // for ranks to start an assignment, or to come back after a restart
  double restart_backoff_s = 2;  // before retry k: backoff * 2^(k-1), at most 60 s
};

// A registered worker rank, as its own messages describe it.
struct RankEntry {
  wire::RankInfo info;
  std::string identity;  // ZeroMQ routing id of its latest message
  double last_seen = 0;
  int64_t job = 0;  // what its latest heartbeat says it runs; 0: idle
  int attempt = 0;
  std::string last_log_line;
};

// An attempt the coordinator believes is running.
struct RunningAttempt {
  int64_t job = 0;
  int attempt = 0;
  std::string world;
  std::vector<int> ranks;  // world ranks, job rank order
  double started_at = 0, estimated_end = 0;
  std::set<int> finished;  // ranks whose JobResult arrived
  std::set<int> present;   // ranks seen running it (re-adoption)
  bool adopted = true;     // false after a restart until every rank is back
  std::string summary_json;
};

class Server {
 public:
  // Opens the store (StoreError if it is corrupt and not `fresh`) and binds.
  explicit Server(ServerOptions options);
  // Serves until `stop` becomes true (checked every 100 ms).
  void Run(const std::atomic<bool>& stop);
  // Handles one message as if `data` had arrived from the peer `identity` (its ZeroMQ
  // routing id): parse, check the version, dispatch, reply. Never throws for any
  // bytes; this is the loop's entry point and the wire fuzzer's (tests/fuzz/fuzz_wire).
  void HandleFrame(const std::string& identity, const void* data, size_t size);
  int64_t bad_frames() const { return bad_frames_; }
  std::string endpoint() const;

 private:
  using RankKey = std::pair<std::string, int>;  // (world, rank)

  void ReceiveOne();
  // nullopt: the message needs no reply (worker traffic answers itself).
  std::optional<wire::Envelope> Dispatch(const std::string& identity, const wire::Envelope& request);
  wire::Envelope Handle(const wire::Envelope& request);
  wire::Envelope Submit(const wire::SubmitRequest& request);
  wire::Envelope List();
  wire::Envelope Status(int64_t id);
  wire::Envelope Cancel(int64_t id);
  wire::Envelope Logs(const wire::LogsRequest& request);
  wire::Envelope Report(int64_t id);
  wire::Envelope Workers();
  void Reply(const zmq::message_t& identity, const wire::Envelope& reply);
  void Send(const std::string& identity, const wire::Envelope& message);

  // Worker pools (server_pool.cc).
  void ReloadRunningAttempts();
  void OnRegister(const std::string& identity, const wire::Register& message);
  void OnHeartbeat(const std::string& identity, const wire::Heartbeat& message);
  void OnEpoch(const std::string& identity, const wire::EpochReport& message);
  void OnResult(const std::string& identity, const wire::JobResult& message);
  void OnRankExit(const std::string& identity, const wire::RankExit& message);
  void Tick();
  void PulseRanks(double now);
  void ExpireSilentRanks(double now);
  void CheckAttemptsStarted(double now);
  void ScheduleQueued(double now);
  void StartAttempt(const JobRecord& job, const Placement& placement, double now);
  void SendAssign(const JobRecord& job, const RunningAttempt& attempt, int world_rank);
  void SucceedAttempt(RunningAttempt attempt);
  // How an ended attempt counts against resources.max_restarts.
  enum class Retry {
    kCounted,  // the job's own failure (or one we cannot tell apart from it): uses a restart
    kFree,     // interrupted from outside (its pool was stopped, or never came back): requeued as is
    kNever,    // its input is at fault: retrying cannot help
  };
  // Ends the attempt and requeues the job (with a backoff for counted failures), unless
  // the policy or the spent restarts say it fails with `reason`.
  void FailAttempt(int64_t job, const std::string& reason, Retry retry = Retry::kCounted);
  void StopRanks(const RunningAttempt& attempt, const std::string& reason);
  void WriteEpochFiles(int64_t job);
  void NoteAdoption(RunningAttempt* attempt, int world_rank);
  void SendStopIfStale(const RankEntry& rank);
  // The running attempt this rank belongs to and whose result it has not sent; null if none.
  RunningAttempt* AttemptAwaiting(const RankKey& key);
  std::string DescribeRank(const RankKey& key) const;
  std::string JobRunsDir(int64_t job) const;

  ServerOptions options_;
  std::unique_ptr<StateStore> store_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  int64_t bad_frames_ = 0;
  std::map<RankKey, RankEntry> ranks_;
  std::map<int64_t, RunningAttempt> running_;  // by job id
  std::set<int64_t> reported_unplaceable_;
  bool schedule_due_ = true;
  double last_pulse_ = 0, last_schedule_ = 0, started_at_ = 0;
  Scheduler scheduler_;
};

// An Envelope holding an ErrorReply.
wire::Envelope ErrorEnvelope(int code, const std::string& message);

// Seconds since the epoch (wall clock: also what the store records).
double WallNow();

}  // namespace trainyard
