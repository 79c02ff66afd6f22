// The coordinator's durable state in SQLite (WAL mode): jobs, attempts, events and
// epoch rows. Every mutating call commits before it returns, so what the coordinator
// acknowledges survives a crash, unless a Transaction is open: then the calls made
// under it commit together, once, or not at all. Not thread-safe: the coordinator's
// loop thread owns it.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "coordinator/decayed_usage.h"
#include "trainyard.pb.h"

namespace trainyard {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// kStopped: a search's trial that ASHA stopped at a rung (Note [ASHA] in coordinator/search.h).
enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled, kStopped };
const char* ToString(JobState state);
JobState JobStateFromString(const std::string& text);

// The rows SQLite has stepped through in full-table scans, summed over every store of
// this process (SQLITE_STMTSTATUS_FULLSCAN_STEP): what the store's indexes leave
// unindexed. A test holds it at 0 for the queries the loop makes per job or per pass.
int64_t FullScanSteps();

struct JobRecord {
  int64_t id = 0;  // also the submission order
  std::string name, idempotency_key, source, base_dir;
  std::string spec_yaml;  // the job file; empty in a listing (StateStore::Jobs)
  std::string user;       // who submitted it, as jobctl says (Note [Usage])
  JobState state = JobState::kQueued;
  int priority = 0, ranks = 1, max_restarts = 0, attempts = 0;
  std::string device = "any";
  std::string reason;                       // why it failed or was cancelled
  double submitted_at = 0, not_before = 0;  // not_before: requeue backoff
  double estimate_s = 0;                    // resources.estimate_minutes; 0 = unknown
  bool preemptible = true;                  // resources.preemptible
  int64_t search = 0;                       // a trial: the search it belongs to
  bool is_search = false;                   // a search: it runs trials, not ranks of its own
  std::string metric;                       // checkpoint.best_metric; empty: none named
};

// Which jobs a listing holds (jobctl list's filters); each empty field matches every job.
struct JobFilter {
  std::vector<JobState> states;  // any of these
  std::string user;              // exactly this owner
  std::string name_contains;     // a name containing this text
  int64_t limit = 0;             // at most this many, the newest; 0: no limit
  int64_t before_id = 0;         // only jobs with a smaller id (the next page's cursor); 0: any
};

// An elastic job's replicas and quorum (distributed.elastic; Note [Step quorum] in
// coordinator/quorum_service.h). Not elastic while max_replicas is 0.
struct ElasticOptions {
  int min_replicas = 1, max_replicas = 0;
  double join_window_s = 10, timeout_s = 300;
};

struct NewJob {
  std::string name, idempotency_key, spec_yaml, source, base_dir, device = "any", user;
  int priority = 0, ranks = 1, max_restarts = 0;
  double estimate_s = 0;
  bool preemptible = true;
  int64_t search = 0;
  bool is_search = false;
  std::string metric;  // checkpoint.best_metric (Note [A job's metric] in coordinator/job_views.h)
  ElasticOptions elastic;
};

// A hyperparameter search (coordinator/search.h): how it judges its trials.
struct SearchRecord {
  int64_t job = 0;  // the search's own job row
  std::string method, metric;
  bool maximize = true;
  int eta = 3, max_epochs = 0, max_concurrent = 1;
  std::vector<int> rungs;  // ASHA's: the epochs at which trials are judged
};

// One trial of a search: its job file, and the job it became once submitted.
struct TrialRecord {
  int64_t search = 0;
  int trial = 0;  // 1-based
  std::string name, params_json, yaml, base_dir, source;
  NewJob job_fields;   // what its job is submitted with (ranks, device, priority, ...)
  int64_t job = 0;     // 0: not submitted yet
  int stopped_at = 0;  // the rung epoch ASHA stopped it at; 0: not stopped
};

// A trial's metric at a rung, and whether ASHA let it go on.
struct RungResult {
  int trial = 0;
  double value = 0;
  bool promoted = false;
};

struct EpochRecord {
  int attempt = 0, epoch = 0;
  std::string csv_line, csv_header, breakdown_json;
};

struct EventRecord {
  double at = 0;  // wall clock
  std::string text;
};

struct AttemptRecord {
  int64_t job = 0;
  int attempt = 0;
  std::string placement;
  double started_at = 0, ended_at = 0;
  // How it ended (the wire's enum, kept in the store by its name: "failed"), and why;
  // OUTCOME_UNSPECIFIED while it runs.
  wire::Outcome end = wire::OUTCOME_UNSPECIFIED;
  std::string end_reason;
  // Note [Usage]: when its ranks began to run (0: not yet), how many, and of them on a GPU.
  double ran_from = 0;
  int ranks = 0, gpus = 0;
  int64_t preempted_by = 0;  // the job it was asked to stop for (Note [Preemption]); 0: none
  // Rank-seconds and GPU-seconds it used, until `now` while it runs.
  double RankSeconds(double now) const;
  double GpuSeconds(double now) const;
};

// Note [Usage]
// Each attempt records when its ranks began to run (a pool attempt: when it was assigned;
// an attempt run as a Slurm job: when Slurm started it, as the coordinator saw it first,
// through squeue or its rank 0's registration), how many ranks it had and how many of
// them had a GPU. It used ranks x (end - start) rank-seconds and gpus x (end - start)
// GPU-seconds; time spent waiting in a queue (ours or Slurm's) is not counted. A job's
// user is its owner: the name of the client key that submitted it, or, for a key with
// no name, the login name jobctl reports (Note [Client keys name users] in
// common/curve/curve_keys.h).
//
// Note [Fair share]
// For fair share, a user's usage is decayed as Slurm's PriorityDecayHalfLife does: a
// rank-second used `age` seconds ago counts 2^(-age / half_life). An attempt's ranks
// that ran from t0 to t1 thus count ranks x H/ln 2 x (2^(-(now-t1)/H) - 2^(-(now-t0)/H)),
// with H the half-life, computed from the store at each pass, so a restarted
// coordinator orders the queue as the one before it did. A half-life of 0 does not decay.
// The ended attempts' part is a running total per user (coordinator/decayed_usage.h),
// read from the store once and then added to as attempts end; only the running ones are
// read at each pass.
struct Usage {
  std::string user;  // empty in a total over every user
  int64_t jobs = 0, attempts = 0;
  double rank_seconds = 0, gpu_seconds = 0;
};

// Note [History retention]
// A coordinator that runs for months keeps every job it ever ran unless told otherwise.
// With --keep-history DAYS the store forgets the jobs that ended more than DAYS ago, a
// few hundred per transaction: each job's row, attempts, epoch rows and events, and a
// search with its trials, rung results and trial jobs (a trial job goes only with its
// search, so a search's report stays whole while it is kept). Run folders stay: they are
// the user's. What the coordinator counts over its whole history keeps counting the
// jobs it forgot: before their rows go, in the same transaction, their figures are added
// to history_totals (jobs by state and owner, attempts by outcome, each owner's usage,
// the submit-to-running seconds in buckets, and each owner's fair-share usage decayed to
// the moment of pruning), and every reader of those figures adds the totals to what the
// rows still say. So `jobctl usage`, fair share and /metrics' counters and histogram read
// the same before and after a prune; only listings and a forgotten job's own queries
// lose it, and its idempotency key names nothing any more. A fair-share total decays on
// from its moment at the half-life in force then; one folded under another
// --fairshare-half-life is not recomputed. A job's end is `ended_at`, set when it moves
// to a final state (SUCCEEDED, FAILED, CANCELLED, STOPPED).

// Submit-to-running observations of forgotten jobs: how many at each upper bound of the
// buckets they were folded into (infinity last), their sum and their number.
struct FoldedHistogram {
  std::map<double, int64_t> by_upper_bound;
  double sum = 0;
  int64_t count = 0;
};

class StatementCache;  // sqlite_statement.h: Note [Prepared statements]

class StateStore {
 public:
  // Opens or creates the database, and holds an exclusive lock on it ("<path>.lock")
  // until destroyed: a second store on the same file (a second coordinator) gets a
  // StoreError naming the first one's pid. A database failing `PRAGMA integrity_check`,
  // or a 0-byte file, is refused with a StoreError, unless `start_fresh`, which moves a
  // corrupt one aside to "<path>.corrupt" and starts empty. So is one that cannot be
  // written.
  StateStore(const std::string& path, bool start_fresh);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // One state change as one commit: BEGIN IMMEDIATE when made, COMMIT at Commit(), and
  // ROLLBACK when destroyed without it (an exception on the way). Transactions nest:
  // only the outermost one begins and commits. REQUIRES: the store outlives it.
  class Transaction {
   public:
    explicit Transaction(StateStore& store);
    ~Transaction();
    Transaction(const Transaction&) = delete;
    Transaction& operator=(const Transaction&) = delete;
    void Commit();

   private:
    StateStore& store_;
    bool done_ = false;
  };

  // Inserts a queued job, or returns the existing one with the same idempotency key of the
  // same user: keys are scoped by owner, so one user's key never names another's job.
  // `*created` tells which.
  JobRecord Submit(const NewJob& job, double now, bool* created);
  std::optional<JobRecord> Find(int64_t id) const;
  // The job `user` submitted with idempotency key `key`, if any.
  std::optional<JobRecord> FindByKey(const std::string& user, const std::string& key) const;
  // Listings: Jobs, JobsIn and JobsMatching leave each record's spec_yaml empty (a
  // scheduling pass or a page of the API need not read every job file); Find reads it.
  std::vector<JobRecord> Jobs() const;
  std::vector<JobRecord> JobsIn(JobState state) const;
  // The queued jobs (JobsIn(kQueued)) by id, from memory: Note [The queue in memory].
  // The reference is valid until the next call that changes the store.
  const std::map<int64_t, JobRecord>& Queued() const;
  // The jobs `filter` matches, newest first.
  std::vector<JobRecord> JobsMatching(const JobFilter& filter) const;
  // How many jobs match `filter`'s states, user and name, on every page: its limit and
  // before_id are ignored.
  int64_t CountMatching(const JobFilter& filter) const;
  // A final state (SUCCEEDED, FAILED, CANCELLED, STOPPED) records `now` as the job's end
  // (Note [History retention]); any other clears it.
  void SetState(int64_t id, JobState state, const std::string& reason, double now);
  // Opens attempt n+1 of a job and marks it running; returns n+1.
  int StartAttempt(int64_t id, const std::string& placement, double now);
  void EndAttempt(int64_t id, int attempt, wire::Outcome end, const std::string& reason, double now);
  // Note [Usage]: the attempt's ranks run from `ran_from` on (set once; later calls do nothing).
  void StartUsage(int64_t id, int attempt, double ran_from, int ranks, int gpus);
  // Records that the attempt was asked to stop for job `by` (Note [Preemption]), so that a
  // restarted coordinator still counts its slots as freeing.
  void MarkPreempted(int64_t id, int attempt, int64_t by);
  // The attempt runs on `placement` now: an elastic attempt's replica replacing a lost one
  // on a slot it had not run on (Note [Replacement replicas]).
  void SetPlacement(int64_t id, int attempt, const std::string& placement);
  // The usage of every attempt that has run, up to `now`: one total, or one per user.
  std::vector<Usage> UsageBy(bool per_user, double now) const;
  // Note [Fair share]: each user's decayed rank-seconds at `now`.
  std::map<std::string, double> DecayedRankSeconds(double now, double half_life_s) const;
  std::vector<AttemptRecord> Attempts(int64_t id) const;
  // Attempts not ended yet, of every job: what a restarted coordinator re-adopts.
  std::vector<AttemptRecord> OpenAttempts() const;
  void Requeue(int64_t id, const std::string& reason, double not_before);
  // Adds the row of one epoch of a job; a row already stored for that (job, epoch),
  // from this attempt or an earlier one, is kept and false is returned, so a resent
  // report or a resumed attempt never duplicates an epoch.
  bool AddEpochRow(int64_t id, const EpochRecord& row);
  // In epoch order.
  std::vector<EpochRecord> EpochRows(int64_t id) const;
  // The job's newest epoch row; nullopt if it has none.
  std::optional<EpochRecord> NewestEpochRow(int64_t id) const;
  // The job's newest epoch row whose header has column `column`; nullopt if none has.
  std::optional<EpochRecord> NewestRowWith(int64_t id, const std::string& column) const;
  void AddEvent(int64_t id, const std::string& text, double now);
  std::vector<std::string> Events(int64_t id) const;
  std::vector<EventRecord> TimedEvents(int64_t id) const;
  // For the metrics, counted by SQLite without building a record per job: jobs by
  // (state, user); each started job's seconds from submission to its first attempt's
  // start (at least 0); and the ended attempts by outcome.
  std::map<std::pair<std::string, std::string>, int64_t> JobCountsByStateAndUser() const;
  std::vector<double> SecondsToFirstStart() const;
  std::map<wire::Outcome, int64_t> AttemptOutcomes() const;
  std::string journal_mode() const;

  // Note [History retention] (state_store_history.cc). Forgets at most `most` of the jobs
  // that ended before `before`, the oldest first, folding their figures into the history
  // totals in one transaction: their fair-share usage decayed to `now` at `half_life_s`,
  // their submit-to-running seconds into buckets of the ascending `first_start_bounds`.
  // Returns how many jobs it forgot, a search's trial jobs included.
  int64_t PruneHistory(double before, double now, double half_life_s, const std::vector<double>& first_start_bounds,
                       int64_t most);
  // The submit-to-running observations PruneHistory folded.
  FoldedHistogram PrunedFirstStarts() const;

  // Searches (coordinator/search.h). AddSearch stores the search and its trials, none
  // submitted yet.
  void AddSearch(const SearchRecord& search, const std::vector<TrialRecord>& trials);
  std::optional<SearchRecord> FindSearch(int64_t job) const;
  std::vector<TrialRecord> Trials(int64_t search) const;
  // The trial whose job is `job`; nullopt for a job that is no trial.
  std::optional<TrialRecord> TrialOfJob(int64_t job) const;
  void SetTrialJob(int64_t search, int trial, int64_t job);
  void SetTrialStopped(int64_t search, int trial, int epoch);
  // Records a trial's result at the rung `epoch`; false (nothing changed) if it has one.
  bool AddRungResult(int64_t search, int epoch, const RungResult& result, double now);
  // The results at a rung, in the order they were recorded.
  std::vector<RungResult> RungResults(int64_t search, int epoch) const;

  // World tokens (Note [Worlds cannot be squatted] in rank_registry.h): the first token a world
  // registered with, kept across restarts, with the last moment the world was known in
  // use. KeepWorldToken ignores a world already kept.
  void KeepWorldToken(const std::string& world, const std::string& token, double now);
  std::map<std::string, std::string> WorldTokens() const;
  // Marks `worlds` as in use at `now`: their bindings outlive ForgetWorldsRegisteredBefore.
  void TouchWorlds(const std::vector<std::string>& worlds, double now);
  // Forgets the worlds last known in use before `before` that no open attempt names.
  void ForgetWorldsRegisteredBefore(double before);

  // An elastic job's options, as submitted; nullopt for any other job.
  std::optional<ElasticOptions> ElasticOptionsOf(int64_t job) const;
  // The highest quorum id given to `job`'s elastic steps, across its attempts and the
  // coordinator's restarts (Note [Step quorum]: ids only grow); 0: none. KeepQuorumId
  // never lowers it.
  uint64_t LastQuorumId(int64_t job) const;
  void KeepQuorumId(int64_t job, uint64_t id);

 private:
  void Exec(const std::string& sql) const;
  void Lock(const std::string& path);
  void CheckNotEmptied(const std::string& path, bool start_fresh) const;
  void Open(const std::string& path);
  void CloseDatabase();
  void CheckIntegrity(const std::string& path) const;
  // Throws StoreError unless the database can be written (a read-only file, or a
  // folder the journal cannot be created in): found at start, not at the first change.
  void CheckWritable(const std::string& path) const;
  bool HasTable(const std::string& table) const;
  bool HasColumn(const std::string& table, const std::string& column) const;
  // The tables this version has and the database lacks; a new database is marked as
  // this version's.
  void CreateSchema();
  // Brings a database made by an earlier schema version to this one, in one transaction
  // (the versions are listed above it); refuses one made by a later version.
  void Migrate(const std::string& path);
  void MigrateToVersionTwoColumns();
  void MigrateToOutcomeNames();
  void MigrateToEndedAt();
  void CreateIndexes();
  // Adds `column` (with its SQL declaration) to `table` of a database made by a version
  // that did not have it.
  void AddColumnIfMissing(const std::string& table, const std::string& column, const std::string& declaration);

  // Loads ended_usage_ from every ended attempt in the store, and the fair-share totals
  // of the jobs it forgot (Note [History retention]).
  void LoadEndedUsage(double half_life_s) const;
  // Adds `delta` to the history total (kind, user, key) (Note [History retention]).
  void AddToHistory(const std::string& kind, const std::string& user, const std::string& key, double delta);
  // The history totals of `kind`, by (user, key).
  std::map<std::pair<std::string, std::string>, double> HistoryTotals(const std::string& kind) const;
  // Folds job `id`'s figures into the history totals and deletes its rows; a search's
  // trial jobs go with it. Returns the jobs deleted.
  int64_t ForgetJob(int64_t id, double now, double half_life_s, const std::vector<double>& first_start_bounds);
  void FoldFairShare(const std::map<std::string, double>& decayed_at_now, double now, double half_life_s);
  // Brings job `id`'s entry in queued_ (if loaded) in step with its row.
  void UpdateQueued(int64_t id);

  sqlite3* db_ = nullptr;
  std::unique_ptr<StatementCache> statements_;  // of db_
  int lock_fd_ = -1;
  int transaction_depth_ = 0;
  // Note [Fair share]: the ended attempts' decayed usage; empty until the first
  // DecayedRankSeconds, and again after a rollback (it is then read afresh).
  mutable std::optional<DecayedUsage> ended_usage_;
  // Note [The queue in memory]: the queued jobs' listed rows; empty until the first
  // Queued(), and again after a rollback.
  mutable std::optional<std::map<int64_t, JobRecord>> queued_;
};

}  // namespace trainyard
