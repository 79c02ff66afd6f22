// The coordinator daemon: one ZeroMQ ROUTER socket serving jobctl and worker ranks
// with protobuf Envelopes, over the SQLite state store.
//
// Who may say what (common/curve/curve_keys.h): the socket is a CURVE server, and the ZAP
// handler admits only allowed keys, tagged worker or client. Client requests need the
// client role and worker messages the worker role; a worker message also needs the
// rank token its (world, rank) registered with, and results, epoch reports and exits
// count only from a rank of that attempt. Everything else is refused with an error
// reply and changes nothing. `insecure` turns all of this off, loudly.
//
// One thread owns the socket, the store, the worker registry and every running
// attempt. A frame that does not parse is counted and dropped, with an ErrorReply
// where the sender is known; no input can end the loop. Messages over
// `max_message_bytes` are refused with an ErrorReply; those over it by more than
// kWireMarginBytes are refused by ZeroMQ itself (ZMQ_MAXMSGSIZE), which drops that
// peer's connection.
//
// Worker pools (server_pool.cc), after the ZeroMQ Guide's Paranoid Pirate: each rank
// registers and heartbeats. A rank silent for `liveness` heartbeats is gone, and so is
// any attempt it was part of. The coordinator sends a rank nothing unasked (no pulse per
// rank per second on the loop): the agents watch their connections with ZMTP heartbeats,
// which ZeroMQ's I/O thread answers (Note [Link liveness] in worker/pool/pool_agent.cc).
// Life of an attempt: Assign to every rank of the placement -> the agent of its first
// rank (the lead) runs the job as its own mpirun, while the others hold their slots
// (Note [Job isolation] in worker/pool/job_process.h) -> epoch reports and then one
// JobResult from the lead, which decide the attempt -> StopJob to the other ranks,
// which answer with a "released" result and are free again. It fails on a failing result,
// a RankExit from a rank's supervisor (naming the exit code or signal), a lost rank,
// or ranks that never start it; a failed job is requeued (resuming from its last
// checkpoint) after a backoff, until resources.max_restarts is spent. A preempted
// attempt (Note [Preemption] in server_pool.cc) ends as interrupted and is requeued at
// once, without using a restart.
//
// After a restart the running attempts are reloaded from the store and wait up to
// `grace_s` for their ranks to re-register naming them; reports resent by the workers
// are deduplicated by (job, epoch). A job found RUNNING with no open attempt (a state
// written by an older version) is requeued at start.
//
// Every state change of an attempt (start, success, failure, cancel) is one SQLite
// transaction, committed before any message about it is sent.
//
// Note [Dashboard queries]
// The dashboard (coordinator/dashboard_server.h) answers HTTP on threads of its own, but
// the store and the registry belong to the loop. So each GET of its JSON API or of
// /metrics becomes one query on an inproc ZeroMQ socket (kWebEndpoint) that the loop
// polls beside its ROUTER: [target] in, [status][content type][body] out. The loop
// answers between worker messages (AnswerWebQueries), with the same JobViews
// (coordinator/job_views.h) jobctl's answers come from; they hold the loop's state by
// const reference, and the HTTP side never writes anything, so the API is read-only by
// construction.
//
// The listening clock: Note [Listening time] in coordinator/listening_clock.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/log_limiter.h"
#include "common/regular_file.h"
#include "coordinator/artifacts.h"
#include "coordinator/attempt_book.h"
#include "coordinator/elastic_quorums.h"
#include "coordinator/job_output.h"
#include "coordinator/job_views.h"
#include "coordinator/launcher.h"
#include "coordinator/listening_clock.h"
#include "coordinator/pool_launcher.h"
#include "coordinator/rank_registry.h"
#include "coordinator/running_attempt.h"
#include "coordinator/search_driver.h"
#include "coordinator/slurm.h"
#include "coordinator/state_store.h"
#include "coordinator/submit_parser.h"
#include "coordinator/zap_handler.h"
#include "proto/wire_version.h"
#include "trainyard.pb.h"

namespace trainyard {

class Metrics;  // common/metrics.h

// Note [Policy by role]
// A named client key of role `user` (coordinator --add-client NAME) may not ask for what
// would take the pool from others: a priority above --user-max-priority (default 0),
// which would preempt everyone's jobs, or `preemptible: false`, which would hold its
// slots against every priority. Both are refused at submission (exit 2, naming the rule),
// as Slurm's QOS bounds the priority and preempt mode an association may use. Admin
// keys, keys with no name, and every client of an --insecure coordinator are admins. A
// queued head that preemption cannot help names the jobs that opted out and hold the
// slots it needs (coordinator/scheduler.h, rule 5). A search counts as its
// max_concurrent jobs against --user-max-queued, and as that many of its largest trial
// against --user-max-ranks.

struct ServerOptions {
  std::string listen = "tcp://127.0.0.1:5555";
  std::string state_path = "trainyard.db";
  std::string runs_dir = "runs";
  bool fresh = false;
  int64_t max_message_bytes = 16 << 20;
  int64_t max_output_bytes = int64_t(64) << 20;  // an attempt's output.log is rotated past this (Note [Job output])
  double heartbeat_s = 1.0;                      // the period workers are expected to heartbeat at
  int liveness = 3;                              // heartbeats a rank may miss before it is gone
  double grace_s = 30;                           // for ranks to start an assignment, or to come back after a restart
  double restart_backoff_s = 2;                  // before retry k: backoff * 2^(k-1), at most 60 s
  std::string keys_dir = "keys";                 // coordinator.key, workers.allow, clients.allow
  bool insecure = false;                         // no CURVE, no roles: development only
  YamlBudget submit_budget;                      // size, node and depth caps of a submitted job file
  size_t max_pending_submits = 64;
  int64_t list_page = 500;                  // jobs in one listing reply (ListReply in proto/trainyard.proto)
  double keep_history_days = 0;             // --keep-history (Note [History retention]); 0: keep every job
  int64_t max_ranks_per_worker_key = 4096;  // registered at once (Note [Peer text is bounded at reception])
  SlurmOptions slurm;                       // --slurm: each attempt is a Slurm job (Note [Attempts as Slurm jobs])
  SchedulingPolicy policy;
  // Seconds since the epoch, read by the loop thread: what the store records, what usage
  // and fair share accrue on, and what restart backoffs and the listening clock (Note
  // [Listening time]) run on. Empty: the system clock. In-process tests pass a clock they
  // move by hand, so hours of usage or a backoff pass without sleeping; a jump of more
  // than a heartbeat reads as a stall of the loop (every rank gets a fresh window).
  std::function<double()> clock;
  // Where the loop's messages to peers go: empty, the ROUTER socket. In-process tests
  // collect them here and feed the loop with HandleFrame and Step, so a whole attempt's
  // life is driven message by message, on the clock above, without sockets or sleeps.
  // Called on the loop thread with the peer's routing id and the message.
  std::function<void(const std::string& identity, const wire::Envelope& message)> outbox;
};

// Options that cannot work (a runs folder that cannot be written): found at start.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Note [Files a job wrote]
// The loop reads a few files from a job's run folder: endpoints.json for `jobctl status`,
// summary.json for reports, latency_heatmap.svg for the dashboard. A job (any key holder
// who can submit one) decides what lies there, so each is read through
// ReadFileBeneath (common/regular_file.h): no symlink below the runs folder, nothing but
// a regular file, opened without blocking, and capped. A FIFO or /dev/zero in its place
// is refused in microseconds instead of stalling the loop and failing healthy jobs.
inline constexpr int64_t kWireMarginBytes = 64 << 10;
inline constexpr double kWorldTokenDays = 30;
inline constexpr double kHistoryPassS = 600;
inline constexpr int64_t kHistoryBatch = 200;           // jobs forgotten in one transaction
inline constexpr size_t kMaxUserBytes = 256;            // of the user a submission names
inline constexpr size_t kMaxIdempotencyKeyBytes = 256;  // of a submission's --key

// Note [Peer text is bounded at reception]
// Free text a worker key sends (a heartbeat's or a rank exit's last log line, a result's
// message) is cut to kMaxPeerLineBytes as it arrives, at a UTF-8 character boundary,
// with the cut marked; a registration's host and device past kMaxPeerNameBytes are
// refused (its world id already is). So the failure reasons, events, log lines and API
// answers made from them are bounded whatever a peer sends. And so is what one worker key
// holds: at most --max-ranks-per-worker-key ranks registered with it at once (a
// re-registration of a rank it holds does not count twice), so at most that many times
// a registration's few KiB; a registration past it is refused.
inline constexpr size_t kMaxPeerLineBytes = 2048;
inline constexpr size_t kMaxPeerNameBytes = 256;
// `text` cut to at most `max` bytes, its end marked, at a UTF-8 character boundary.
std::string CutText(const std::string& text, size_t max);
// Cuts the free text of a worker message (Note [Peer text is bounded at reception]).
void BoundPeerText(wire::Envelope* message);

class Server : private SearchLoop, private LaunchLoop {
 public:
  // Opens the store (StoreError if it is corrupt and not `fresh`, or cannot be written),
  // checks that the runs folder can be written (ConfigError) and binds.
  explicit Server(ServerOptions options);
  ~Server();
  // Serves until `stop` becomes true (checked every 100 ms). When `reload_keys` is given
  // and becomes true (the coordinator's SIGHUP), the loop clears it and re-reads the
  // allowlists (ReloadKeys).
  void Run(const std::atomic<bool>& stop, std::atomic<bool>* reload_keys = nullptr);
  // One turn of the loop: waits up to `wait_s` for a message, a finished submission check
  // or a dashboard query, handles what came, then runs the timers (liveness, grace
  // periods, Slurm, searches, scheduling). Run is Step(0.1) until `stop`; in-process
  // tests call it directly.
  void Step(double wait_s);
  // Re-reads workers.allow and clients.allow from the key folder for the connections
  // made from now on; connections already admitted stay. A folder that does not load
  // (KeyError: a bad line, a missing file) is logged and the lists in use are kept. True
  // if the new lists are in use. An insecure coordinator has none and returns false.
  bool ReloadKeys();
  // How many times the loop has re-read the keys for `reload_keys` (whether they loaded
  // or not); safe to read from any thread.
  int64_t key_reloads() const { return key_reloads_; }
  // Handles one message as if `data` had arrived from the peer `identity` (its ZeroMQ
  // routing id) whose ZAP role is `role` ("worker", "client", or "" without CURVE):
  // parse, check the version and the role, dispatch, reply. Never throws for any bytes;
  // this is the loop's entry point and the wire fuzzer's (tests/fuzz/fuzz_wire).
  void HandleFrame(const std::string& identity, const std::string& role, const void* data, size_t size);
  int64_t bad_frames() const { return bad_frames_; }
  // Messages refused for their sender: a wrong role, token or attempt.
  int64_t refused_messages() const { return refused_messages_; }
  std::string endpoint() const;
  // Note [Dashboard queries]: where the dashboard's HTTP threads ask, on context().
  static constexpr const char* kWebEndpoint = "inproc://trainyard-dashboard";
  zmq::context_t& context() { return context_; }
  // Answers one GET of the dashboard's API (/api/jobs, /api/jobs/<id>,
  // /api/jobs/<id>/heatmap.svg, /api/workers) or /metrics: the loop's side of a query,
  // public for tests. Unknown paths and jobs get 404.
  WebReply AnswerWebQuery(const std::string& target) const { return views_->Answer(target); }

 private:
  // ServerOptions::clock's time, or the system clock's.
  double Now() const override;
  void ReceiveOne();
  void AdvanceListeningClock(double now);
  void CheckRunsDir() const;
  void FinishSubmissions();
  void FinishSubmission(const ParsedSubmission& parsed);
  void RequeueRunningWithoutAttempt();
  // nullopt: the message needs no reply (worker traffic answers itself).
  std::optional<wire::Envelope> Dispatch(const std::string& identity, const ClientIdentity& client,
                                         const wire::Envelope& request);
  // Why `role` (the ZAP user id; empty without CURVE) may not send `request`, or "".
  std::string RoleRefusal(const std::string& role, const wire::Envelope& request) const;
  // The registered rank (world, rank) if `token` is its token; otherwise null, with the
  // refusal counted and answered.
  RankEntry* Authenticated(const std::string& identity, const std::string& world, int rank, const std::string& token,
                           const char* what);
  void Refuse(const std::string& identity, const std::string& why);
  // Refuses a registration as `key` that would take a world bound to another token, or,
  // under --slurm, a "slurm-<id>" world none of the coordinator's attempts expects (`why`
  // says so): counted and shown on the dashboard (Note [Worlds cannot be squatted]).
  void RefuseSquat(const std::string& identity, const RankKey& key, const std::string& why = "");
  wire::Envelope Handle(const ClientIdentity& client, const wire::Envelope& request);
  std::optional<wire::Envelope> Submit(const std::string& identity, const ClientIdentity& client,
                                       const wire::SubmitRequest& request);
  static NewJob JobOf(const JobSpec& spec, const wire::SubmitRequest& request);
  // Why this coordinator cannot run the elastic job `spec` (from `source`), or "": a
  // pool's replica is one rank.
  std::string ElasticRefusal(const JobSpec& spec, const std::string& source) const;
  // Why a job of `priority` (and `preemptible`) may not be submitted with a user key, or
  // "" (Note [Policy by role]).
  std::string PolicyRefusal(bool admin, int priority, bool preemptible) const;
  // PolicyRefusal of the first of the search's trials it refuses, or "".
  std::string SearchPolicyRefusal(const SearchSpec& spec, bool admin) const;
  // Why `user` may not queue one more job of `ranks` ranks, or "": past --user-max-queued,
  // or more ranks than --user-max-ranks lets one user run (it could never start).
  std::string QuotaRefusal(const std::string& user, int ranks) const;
  // QuotaRefusal for a search that runs at most `concurrent` trials of at most `ranks`
  // ranks at once (Note [Policy by role]).
  std::string SearchQuotaRefusal(const std::string& user, int concurrent, int ranks) const;
  int QueuedJobsOf(const std::string& user) const override;
  // Why `user` may not queue one more job (--user-max-queued), or "".
  std::string QueueFullRefusal(const std::string& user) const;
  // Only the job's owner or an admin may cancel it (Note [Client keys name users]).
  wire::Envelope Cancel(int64_t id, const ClientIdentity& client);
  void Reply(const zmq::message_t& identity, const wire::Envelope& reply);
  // Note [Dashboard queries]: answers what the dashboard's threads asked, from views_.
  void AnswerWebQueries();
  void Send(const std::string& identity, const wire::Envelope& message);

  // Worker pools (server_pool.cc).
  void ReloadRunningAttempts();
  // `worker_key`: the public key the registration came with (empty under --insecure).
  void OnRegister(const std::string& identity, const std::string& worker_key, const wire::Register& message);
  void OnHeartbeat(const std::string& identity, const wire::Heartbeat& message);
  void OnEpoch(const std::string& identity, const wire::EpochReport& message);
  void OnResult(const std::string& identity, const wire::JobResult& message);
  void OnRankExit(const std::string& identity, const wire::RankExit& message);
  void OnOutput(const std::string& identity, const wire::JobOutput& message);
  // A job's files (server_artifacts.cc, Note [Artifacts]). Answered later (nullopt) when
  // agents must be asked.
  std::optional<wire::Envelope> Artifacts(const std::string& identity, const ClientIdentity& client,
                                          const wire::ArtifactsRequest& request);
  std::optional<wire::Envelope> Fetch(const std::string& identity, const ClientIdentity& client,
                                      const wire::FetchRequest& request);
  void OnFileList(const std::string& identity, const wire::FileList& message);
  void OnFileChunk(const std::string& identity, const wire::FileChunk& message);
  // The question `request_id` if the sender is an authenticated agent on a host it waits
  // on (that host is then no longer waited on); null otherwise.
  FileQuery* AnsweredQuery(const std::string& identity, int64_t request_id, const std::string& world, int rank,
                           const std::string& token);
  // Answers the question with what came (and, for the hosts still silent, why not).
  void FinishFileQuery(int64_t id);
  void ExpireFileQueries();
  // Why `client` may not read job `id`'s files ("" if it may), with the job in `job`.
  std::string FileRefusal(int64_t id, const ClientIdentity& client, std::optional<JobRecord>* job) const;
  // A registered agent on each host (other than this one) the job's attempts ran on;
  // the slots whose host is no longer known, as reasons, in `unknown`.
  std::map<std::string, RankKey> AgentsOnJobHosts(int64_t job, std::vector<std::string>* unknown) const;
  const std::string& OwnHost() const;
  // Whether (world, rank) is job rank 0 of the job's attempt `attempt`, as the store placed it.
  bool IsJobRankZero(int64_t job, int attempt, const std::string& world, int rank) const;
  // Elastic attempts' quorums (server_elastic.cc; Note [Step quorum]): a replica's
  // messages, from an authenticated rank of the attempt, to quorums_, and what it answers.
  void OnReplicaJoin(const std::string& identity, const wire::ReplicaJoin& message);
  void OnReplicaBeat(const std::string& identity, const wire::ReplicaBeat& message);
  void OnStepVote(const std::string& identity, const wire::StepVote& message);
  // Whether (world, rank) is one of the slots of the attempt, which runs.
  bool IsRankOfAttempt(int64_t job, int attempt, const std::string& world, int rank) const;
  // Who a replica's message says it is from, and for which attempt.
  struct ReplicaSender {
    int64_t job = 0;
    int attempt = 0;
    std::string world;
    int rank = 0;
    std::string token;
  };
  // Whether the sender holds its rank token and is a rank of the attempt; refused if not.
  bool AdmitReplicaMessage(const std::string& identity, const ReplicaSender& sender, const char* what);
  // Refuses the message with `refusal` if there is one, else sends what quorums_ answered.
  void AnswerReplica(const std::string& identity, const std::string& refusal);
  // Sends what quorums_ answered and records its events.
  void SendQuorumAnswers();
  // (world, rank) is gone: the replica it speaks for leaves its quorum.
  void ReplicaGone(const RankKey& key);
  // An attempt of an elastic job (the store keeps its options) is elastic, with a quorum.
  void OpenQuorumIfElastic(RunningAttempt* attempt);
  // A replica of an elastic attempt ended (its lead's result, or its rank lost): it leaves
  // the quorum, its slot is free, and once every replica has ended so does the attempt,
  // succeeded if one did (RunningAttempt::elastic).
  // The agent of `slot`, whose replica of `attempt` was ended when the agent was lost,
  // registered again still running it: the replica is one of the attempt's again.
  void ReplicaBack(RunningAttempt& attempt, const RankKey& slot);
  // Whether a result from `slot` naming replica number `replica` is from a replica of
  // `attempt` that a later one has replaced there.
  bool IsEarlierReplica(const RunningAttempt& attempt, const RankKey& slot, int replica) const;
  void ReplicaEnded(RunningAttempt& attempt, const RankKey& slot, wire::Outcome end, const std::string& message,
                    const std::string& summary_json);
  void Tick();
  void ExpireSilentRanks();
  // Every kHistoryPassS: marks the worlds of registered ranks in use and forgets the
  // worlds unused for kWorldTokenDays (Note [Worlds cannot be squatted]), and, under
  // --keep-history, forgets a batch of jobs that ended before it (Note [History
  // retention]), a batch per tick while there are more.
  void TrimHistory(double now);
  void CheckAttemptsStarted();
  // A pass of the launcher's (Note [Launchers]).
  void ScheduleQueued(double now);
  // Note [Preemption].
  void Preempt(int64_t victim, const std::string& head) override;
  void SendPreemptStop(const RunningAttempt& attempt);
  void CheckPreemptions();
  // LaunchLoop: what the launcher asks of the loop (Note [Launchers]).
  RunningAttempt& OpenAttempt(const JobRecord& job, const std::vector<RankKey>& slots, const std::string& how,
                              double now) override;
  bool MakeAttemptFolder(const JobRecord& job, double now) override;
  void WriteAttemptFile(int64_t job, int attempt, const std::string& name, const std::string& bytes) override {
    WriteJobFile(AttemptDir(job, attempt), name, bytes, job);
  }
  // Searches' submissions and stops (server_search.cc; the rest in SearchDriver, Note [Search
  // life cycle] in coordinator/search.h).
  void FinishSearchSubmission(const ParsedSubmission& parsed);
  // SearchLoop: what the search driver asks of the loop.
  void TrialQueued() override { schedule_due_ = true; }
  void CancelTrial(int64_t id, const ClientIdentity& client) override { Cancel(id, client); }
  void WriteRunsFile(int64_t job, const std::string& name, const std::string& bytes) override {
    WriteJobFile(JobRunsDir(job), name, bytes, job);
  }
  // Acts on a stop decision: a running trial is told to stop, a queued one ends at once.
  void StopTrial(int64_t job, int attempt, int epoch);
  void SendSearchStop(const RunningAttempt& attempt);
  // Ends a trial its search stopped at `epoch`: STOPPED, with its running attempt ended.
  void EndStoppedTrial(int64_t job, int epoch);
  void SendAssign(const JobRecord& job, const RunningAttempt& attempt, const RankKey& to) override;
  void AddReplica(RunningAttempt& attempt, const RankKey& slot, double now) override;
  void ReplicaLost(RunningAttempt& attempt, const RankKey& slot, const std::string& reason) override;
  // Every path that ends a job's running attempt (success, failure, interruption, a
  // cancel, a search's stop) ends it here: through the book (AttemptBook::End: the store
  // first, committed before anyone is told), then its ranks are freed, the launcher gives
  // back what it holds outside (a Slurm allocation), and a scheduling pass is due.
  void EndJobsAttempt(int64_t job, const AttemptEnding& ending);
  void SucceedAttempt(RunningAttempt attempt);
  // Ends the attempt and requeues the job (with a backoff for counted failures), unless
  // the policy or the spent restarts say it fails with `reason`.
  void FailAttempt(int64_t job, const std::string& reason, Retry retry) override;
  void FailAttempt(int64_t job, const std::string& reason) { FailAttempt(job, reason, Retry::kCounted); }
  void StopRanks(const RunningAttempt& attempt, const std::string& reason);
  void WriteEpochFiles(int64_t job);
  void NoteAdoption(RunningAttempt* attempt, const RankKey& slot);
  // `attempt` runs again as the coordinator's, `how` saying with what (its events).
  void Adopt(RunningAttempt* attempt, const std::string& how);
  void SendStopIfStale(const RankEntry& rank);
  // The running attempt this rank belongs to and whose result it has not sent; null if none.
  RunningAttempt* AttemptAwaiting(const RankKey& key) { return running_.Awaiting(key); }
  std::string DescribeRank(const RankKey& key) const { return ranks_->Describe(key); }
  std::string JobRunsDir(int64_t job) const;
  std::string AttemptDir(int64_t job, int attempt) const override;
  // Writes `bytes` to `folder`/`name` atomically, `folder` being JobRunsDir or an
  // AttemptDir, created as needed; logs instead of throwing, and writes nothing where a
  // symlink or a file stands in the folder's way (Note [Files a job wrote]).
  void WriteJobFile(const std::string& folder, const std::string& name, const std::string& bytes, int64_t job) const;

  ServerOptions options_;
  std::unique_ptr<StateStore> store_;
  // What the loop measures of itself since it started (scheduling passes), rendered
  // after the store's figures on /metrics.
  std::unique_ptr<Metrics> loop_metrics_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  zmq::socket_t web_socket_;                   // Note [Dashboard queries]
  std::unique_ptr<SubmitParser> parser_;       // after context_: destroyed before it
  std::unique_ptr<ZapHandler> zap_;            // null when insecure
  std::unique_ptr<OutputFiles> outputs_;       // Note [Job output]
  std::map<int64_t, FileQuery> file_queries_;  // Note [Artifacts]: by request id
  int64_t next_file_query_ = 1;
  int64_t bad_frames_ = 0, refused_messages_ = 0;
  std::atomic<int64_t> key_reloads_{0};
  LogLimiter log_limiter_;                   // what peers can make the loop log
  ListeningClock listening_;                 // Note [Listening time]
  std::unique_ptr<RankRegistry> ranks_;      // after store_ and listening_: destroyed before them
  AttemptBook running_;                      // the attempts running now, by job id
  std::unique_ptr<ElasticQuorums> quorums_;  // Note [Step quorum]: the elastic attempts'
  WaitReasons waiting_;                      // filled by the pool's passes (PoolLauncher)
  int64_t preemptions_ = 0;
  bool schedule_due_ = true;
  double last_liveness_check_ = 0, last_schedule_ = 0, started_at_ = 0;
  double last_history_pass_ = 0;
  bool history_left_ = false;               // the last batch forgot jobs: there may be more
  std::unique_ptr<Launcher> launcher_;      // Note [Launchers]: the pool's, or Slurm's under --slurm
  std::unique_ptr<JobViews> views_;         // reads the members above
  std::unique_ptr<SearchDriver> searches_;  // last: uses the store, the views and the loop
};

// Who a request's key acts as, in events: its user, or the role of a key with no name.
std::string Who(const ClientIdentity& client);
// A submission's user (Note [Usage]) as kept: login-name characters only, each other
// byte as '?', and at most kMaxUserBytes.
std::string PlainUser(const std::string& user);

// The refusal of a submission whose idempotency key already names `existing`, a job
// submitted with another file.
std::string KeyReuseRefusal(const std::string& key, const JobRecord& existing);

// An Envelope holding an ErrorReply.
wire::Envelope ErrorEnvelope(int code, const std::string& message);

// Seconds since the epoch (wall clock: also what the store records).
double WallNow();

}  // namespace trainyard
