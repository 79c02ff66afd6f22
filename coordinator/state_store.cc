#include "coordinator/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "coordinator/sqlite_statement.h"
#include "proto/wire_names.h"

namespace trainyard {

std::atomic<int64_t> full_scan_steps{0};  // FullScanSteps()

namespace {

// The schema this build writes; the versions are listed above StateStore::Migrate.
constexpr int kSchemaVersion = 4;

int SchemaVersion(sqlite3* db) {
  Statement s(db, "PRAGMA user_version");
  return s.Step() ? static_cast<int>(s.Int(0)) : 0;
}

constexpr const char* kJobColumns =
    "id, name, idempotency_key, spec_yaml, source, state, priority, ranks, max_restarts, attempts, device, "
    "reason, submitted_at, not_before, base_dir, estimate_s, user, preemptible, search, kind, metric";
// The same, less the job file (up to the submission bound, 1 MiB): what a listing reads.
constexpr const char* kListedJobColumns =
    "id, name, idempotency_key, '', source, state, priority, ranks, max_restarts, attempts, device, "
    "reason, submitted_at, not_before, base_dir, estimate_s, user, preemptible, search, kind, metric";

constexpr const char* kEpochColumns = "attempt, epoch, csv_line, csv_header, breakdown_json";

EpochRecord ReadEpochRow(const Statement& s) { return {int(s.Int(0)), int(s.Int(1)), s.Text(2), s.Text(3), s.Text(4)}; }

JobRecord ReadJob(const Statement& s) {
  JobRecord j;
  j.id = s.Int(0);
  j.name = s.Text(1);
  j.idempotency_key = s.Text(2);
  j.spec_yaml = s.Text(3);
  j.source = s.Text(4);
  j.state = JobStateFromString(s.Text(5));
  j.priority = int(s.Int(6));
  j.ranks = int(s.Int(7));
  j.max_restarts = int(s.Int(8));
  j.attempts = int(s.Int(9));
  j.device = s.Text(10);
  j.reason = s.Text(11);
  j.submitted_at = s.Real(12);
  j.not_before = s.Real(13);
  j.base_dir = s.Text(14);
  j.estimate_s = s.Real(15);
  j.user = s.Text(16);
  j.preemptible = s.Int(17) != 0;
  j.search = s.Int(18);
  j.is_search = s.Text(19) == "search";
  j.metric = s.Text(20);
  return j;
}

}  // namespace

const char* ToString(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
    case JobState::kStopped:
      return "STOPPED";
  }
  return "?";
}

JobState JobStateFromString(const std::string& text) {
  for (JobState s : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
                     JobState::kCancelled, JobState::kStopped})
    if (text == ToString(s)) return s;
  throw StoreError("unknown job state '" + text + "' in the database");
}

StateStore::StateStore(const std::string& path, bool start_fresh) {
  try {
    Lock(path);
    CheckNotEmptied(path, start_fresh);
    Open(path);
    try {
      CheckIntegrity(path);
    } catch (const StoreError&) {
      if (!start_fresh) throw;
      CloseDatabase();
      std::filesystem::rename(path, path + ".corrupt");
      for (const char* suffix : {"-wal", "-shm"}) std::filesystem::remove(path + suffix);
      Open(path);
    }
    CheckWritable(path);
    CreateSchema();
    Migrate(path);
  } catch (...) {
    CloseDatabase();  // no destructor runs for a constructor that throws
    if (lock_fd_ >= 0) ::close(lock_fd_);
    throw;
  }
}

StateStore::~StateStore() {
  CloseDatabase();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

// Two coordinators on one state file would each schedule the same queue: the second
// is refused. The lock is an flock on "<path>.lock", which holds the owner's pid for
// the message; the kernel releases it when the process ends, however it ends.
void StateStore::Lock(const std::string& path) {
  const std::string lock_path = path + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd_ < 0) throw StoreError(lock_path + ": cannot open the state file's lock: " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char owner[32] = {};
    const ssize_t n = ::pread(lock_fd_, owner, sizeof owner - 1, 0);
    std::string pid = n > 0 ? std::string(owner, size_t(n)) : "";
    pid.erase(pid.find_last_not_of(" \n") + 1);
    throw StoreError(path + ": another coordinator" + (pid.empty() ? "" : " (pid " + pid + ")") +
                     " is using this state file; stop it first, or give this one another --state");
  }
  const std::string mine = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, mine.data(), mine.size(), 0) < 0) {
    // The lock holds; only the pid shown to a second coordinator is missing.
  }
}

// SQLite takes a 0-byte file for a new, empty database. A state file truncated to 0
// (a full disk, a careless `>`) would silently become an empty queue: refused unless
// the user asks for a fresh start.
void StateStore::CheckNotEmptied(const std::string& path, bool start_fresh) const {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || info.st_size != 0 || start_fresh) return;
  throw StoreError(path +
                   ": the state database is an empty file (0 bytes), not a database; restore it, or "
                   "start with --fresh to begin with an empty queue");
}

void StateStore::Open(const std::string& path) {
  if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK)
    throw StoreError(path + ": cannot open the state database: " + sqlite3_errmsg(db_));
  sqlite3_busy_timeout(db_, 5000);
  statements_ = std::make_unique<StatementCache>(db_);
}

void StateStore::CloseDatabase() {
  statements_.reset();  // its statements first: a connection with statements left does not close
  sqlite3_close(db_);
  db_ = nullptr;
}

void StateStore::CheckIntegrity(const std::string& path) const {
  try {
    Statement check(db_, "PRAGMA integrity_check");
    std::string verdict = check.Step() ? check.Text(0) : "no answer";
    if (verdict != "ok") throw StoreError(verdict);
  } catch (const StoreError& e) {
    throw StoreError(path + ": the state database is corrupt (" + e.what() +
                     "); restore it, or start with --fresh to set it aside and begin empty");
  }
}

StateStore::Transaction::Transaction(StateStore& store) : store_(store) {
  if (store_.transaction_depth_ == 0) store_.Exec("BEGIN IMMEDIATE");
  ++store_.transaction_depth_;
}

StateStore::Transaction::~Transaction() {
  if (done_) return;
  if (--store_.transaction_depth_ > 0) return;
  char* error = nullptr;  // no throwing from a destructor: a failed rollback leaves SQLite's own
  sqlite3_exec(store_.db_, "ROLLBACK", nullptr, nullptr, &error);
  sqlite3_free(error);
  store_.ended_usage_.reset();  // it may hold an attempt's end that was rolled back
  store_.queued_.reset();       // and a state change that was
}

void StateStore::Transaction::Commit() {
  if (done_) return;
  if (store_.transaction_depth_ == 1) store_.Exec("COMMIT");  // throws: the destructor rolls back
  done_ = true;
  --store_.transaction_depth_;
}

void StateStore::CheckWritable(const std::string& path) const {
  try {  // rewrites the schema version it read: a write that changes nothing
    Exec("BEGIN IMMEDIATE; PRAGMA user_version = " + std::to_string(SchemaVersion(db_)) + "; COMMIT;");
  } catch (const StoreError& e) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw StoreError(path + ": the state database cannot be written (" + e.what() +
                     "); check the file's and its folder's permissions");
  }
}

void StateStore::Exec(const std::string& sql) const {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    std::string text = error ? error : "unknown error";
    sqlite3_free(error);
    throw StoreError("SQLite: " + text);
  }
}

bool StateStore::HasTable(const std::string& table) const {
  Statement s(*statements_, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
  s.Bind(1, table);
  return s.Step();
}

bool StateStore::HasColumn(const std::string& table, const std::string& column) const {
  Statement columns(*statements_, "SELECT name FROM pragma_table_info(?)");
  columns.Bind(1, table);
  while (columns.Step())
    if (columns.Text(0) == column) return true;
  return false;
}

void StateStore::CreateSchema() {
  Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;");
  const bool new_database = !HasTable("jobs");
  Exec(R"(BEGIN IMMEDIATE;
    CREATE TABLE IF NOT EXISTS jobs(
      id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, idempotency_key TEXT UNIQUE,
      spec_yaml TEXT NOT NULL, source TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL,
      ranks INTEGER NOT NULL, max_restarts INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
      device TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', submitted_at REAL NOT NULL,
      not_before REAL NOT NULL DEFAULT 0, base_dir TEXT NOT NULL DEFAULT '',
      estimate_s REAL NOT NULL DEFAULT 0, user TEXT NOT NULL DEFAULT '',
      preemptible INTEGER NOT NULL DEFAULT 1, search INTEGER NOT NULL DEFAULT 0,
      kind TEXT NOT NULL DEFAULT '', metric TEXT NOT NULL DEFAULT '', ended_at REAL NOT NULL DEFAULT 0);
    CREATE TABLE IF NOT EXISTS attempts(
      job INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL, placement TEXT NOT NULL,
      started_at REAL NOT NULL, ended_at REAL, outcome TEXT, ran_from REAL NOT NULL DEFAULT 0,
      ranks INTEGER NOT NULL DEFAULT 0, gpus INTEGER NOT NULL DEFAULT 0,
      preempted_by INTEGER NOT NULL DEFAULT 0, end_reason TEXT NOT NULL DEFAULT '', PRIMARY KEY(job, attempt));
    CREATE TABLE IF NOT EXISTS epochs(
      job INTEGER NOT NULL REFERENCES jobs(id), epoch INTEGER NOT NULL, attempt INTEGER NOT NULL,
      csv_line TEXT NOT NULL, csv_header TEXT NOT NULL DEFAULT '', breakdown_json TEXT NOT NULL DEFAULT '',
      PRIMARY KEY(job, epoch));
    CREATE TABLE IF NOT EXISTS events(
      job INTEGER NOT NULL REFERENCES jobs(id), at REAL NOT NULL, text TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS worlds(
      world TEXT PRIMARY KEY, token TEXT NOT NULL, registered_at REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS searches(
      job INTEGER PRIMARY KEY REFERENCES jobs(id), method TEXT NOT NULL, metric TEXT NOT NULL,
      maximize INTEGER NOT NULL, eta INTEGER NOT NULL, max_epochs INTEGER NOT NULL,
      max_concurrent INTEGER NOT NULL, rungs TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS trials(
      search INTEGER NOT NULL REFERENCES jobs(id), trial INTEGER NOT NULL, name TEXT NOT NULL,
      params_json TEXT NOT NULL, yaml TEXT NOT NULL, base_dir TEXT NOT NULL, source TEXT NOT NULL,
      priority INTEGER NOT NULL, ranks INTEGER NOT NULL, max_restarts INTEGER NOT NULL, device TEXT NOT NULL,
      estimate_s REAL NOT NULL, preemptible INTEGER NOT NULL, job INTEGER NOT NULL DEFAULT 0,
      stopped_at INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(search, trial));
    CREATE TABLE IF NOT EXISTS rung_results(
      search INTEGER NOT NULL REFERENCES jobs(id), epoch INTEGER NOT NULL, trial INTEGER NOT NULL,
      value REAL, promoted INTEGER NOT NULL, at REAL NOT NULL, PRIMARY KEY(search, epoch, trial));
    CREATE TABLE IF NOT EXISTS history_totals(
      kind TEXT NOT NULL, user TEXT NOT NULL, key TEXT NOT NULL, value REAL NOT NULL,
      as_of REAL NOT NULL DEFAULT 0, PRIMARY KEY(kind, user, key));
    CREATE TABLE IF NOT EXISTS elastic_jobs(
      job INTEGER PRIMARY KEY REFERENCES jobs(id), min_replicas INTEGER NOT NULL DEFAULT 1,
      max_replicas INTEGER NOT NULL DEFAULT 0, join_window_s REAL NOT NULL DEFAULT 10,
      timeout_s REAL NOT NULL DEFAULT 300, last_quorum_id INTEGER NOT NULL DEFAULT 0);
    COMMIT;)");
  if (new_database) Exec("PRAGMA user_version = " + std::to_string(kSchemaVersion));
}

// Schema versions (PRAGMA user_version), each brought to the next by a step below:
//   0  no version written. The first layouts: epochs keyed by (job, attempt, epoch),
//      without their header and breakdown, and jobs without base_dir and estimate_s.
//   1  columns added by features as they came (a job's user, preemptible, search, kind
//      and metric; an attempt's usage and preempted_by), any of which may be missing.
//   2  every column of 1; idempotency keys scoped by owner as "<user>/<key>" (a user
//      name has no '/').
//   3  an attempt's outcome is the wire's Outcome by its name alone ("failed", as
//      proto/wire_names.h gives it), its reason in end_reason; before, one text
//      ("failed: <reason>").
//   4  a job's end in jobs.ended_at (for an ended job of version 3, its newest event, or
//      its submission if it has none), and history_totals (Note [History retention]).
// A table that only adds (elastic_jobs: an elastic job's options and last quorum id) is
// made by CreateSchema on every opening and needs no version: a coordinator that
// predates it leaves it alone (and runs such a job as a plain gang of its replicas).
// Each step is tested on a database made by that version's own schema
// (tests/coordinator/data/schema_v*.sql).
void StateStore::Migrate(const std::string& path) {
  const int from = SchemaVersion(db_);
  if (from > kSchemaVersion)
    throw StoreError(path + ": the state database was written by a newer coordinator (schema version " +
                     std::to_string(from) + "; this one knows up to " + std::to_string(kSchemaVersion) +
                     "); run that coordinator, or one at least as new");
  if (from < kSchemaVersion) {
    Transaction transaction(*this);
    if (from < 2) MigrateToVersionTwoColumns();
    if (from < 2)
      Exec("UPDATE jobs SET idempotency_key = user || '/' || idempotency_key WHERE idempotency_key IS NOT NULL");
    if (from < 3) MigrateToOutcomeNames();
    if (from < 4) MigrateToEndedAt();
    Exec("PRAGMA user_version = " + std::to_string(kSchemaVersion));
    transaction.Commit();
  }
  CreateIndexes();
}

void StateStore::MigrateToVersionTwoColumns() {
  if (!HasColumn("epochs", "csv_header")) {  // version 0's epochs: one row per epoch, the first one stored
    Exec(R"(CREATE TABLE epochs_keyed(
        job INTEGER NOT NULL REFERENCES jobs(id), epoch INTEGER NOT NULL, attempt INTEGER NOT NULL,
        csv_line TEXT NOT NULL, csv_header TEXT NOT NULL DEFAULT '', breakdown_json TEXT NOT NULL DEFAULT '',
        PRIMARY KEY(job, epoch));
      INSERT OR IGNORE INTO epochs_keyed(job, epoch, attempt, csv_line)
        SELECT job, epoch, attempt, csv_line FROM epochs ORDER BY job, epoch, attempt;
      DROP TABLE epochs;
      ALTER TABLE epochs_keyed RENAME TO epochs;)");
  }
  AddColumnIfMissing("jobs", "base_dir", "TEXT NOT NULL DEFAULT ''");
  AddColumnIfMissing("jobs", "estimate_s", "REAL NOT NULL DEFAULT 0");
  AddColumnIfMissing("jobs", "user", "TEXT NOT NULL DEFAULT ''");
  AddColumnIfMissing("jobs", "preemptible", "INTEGER NOT NULL DEFAULT 1");
  AddColumnIfMissing("jobs", "search", "INTEGER NOT NULL DEFAULT 0");
  AddColumnIfMissing("jobs", "kind", "TEXT NOT NULL DEFAULT ''");
  AddColumnIfMissing("jobs", "metric", "TEXT NOT NULL DEFAULT ''");
  AddColumnIfMissing("attempts", "ran_from", "REAL NOT NULL DEFAULT 0");
  AddColumnIfMissing("attempts", "ranks", "INTEGER NOT NULL DEFAULT 0");
  AddColumnIfMissing("attempts", "gpus", "INTEGER NOT NULL DEFAULT 0");
  AddColumnIfMissing("attempts", "preempted_by", "INTEGER NOT NULL DEFAULT 0");
}

// "failed: <reason>" becomes "failed" and the reason. A text whose first word names no
// outcome (none was ever written) is kept whole as the reason of a failure.
void StateStore::MigrateToOutcomeNames() {
  AddColumnIfMissing("attempts", "end_reason", "TEXT NOT NULL DEFAULT ''");
  std::string names;
  for (int value = wire::Outcome_MIN; value <= wire::Outcome_MAX; ++value)
    if (wire::Outcome_IsValid(value) && value != wire::OUTCOME_UNSPECIFIED)
      names += std::string(names.empty() ? "" : ", ") + "'" + OutcomeName(wire::Outcome(value)) + "'";
  const std::string word =
      "CASE WHEN instr(outcome, ': ') > 0 THEN substr(outcome, 1, instr(outcome, ': ') - 1) ELSE outcome END";
  Exec("UPDATE attempts SET end_reason = outcome, outcome = 'failed' WHERE outcome IS NOT NULL AND " + word +
       " NOT IN (" + names + ")");
  Exec(
      "UPDATE attempts SET end_reason = substr(outcome, instr(outcome, ': ') + 2), "
      "outcome = substr(outcome, 1, instr(outcome, ': ') - 1) WHERE instr(outcome, ': ') > 0");
}

void StateStore::MigrateToEndedAt() {
  AddColumnIfMissing("jobs", "ended_at", "REAL NOT NULL DEFAULT 0");
  Exec(
      "UPDATE jobs SET ended_at = COALESCE((SELECT MAX(at) FROM events WHERE events.job = jobs.id), submitted_at) "
      "WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'STOPPED')");
}

// An index for each query the loop makes per job or per scheduling pass, so that none
// reads a whole table however long the history (FullScanSteps() counts what still does).
void StateStore::CreateIndexes() {
  Exec(R"(CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, id);
    CREATE INDEX IF NOT EXISTS jobs_by_user ON jobs(user, id);
    CREATE INDEX IF NOT EXISTS attempts_open ON attempts(job, attempt) WHERE ended_at IS NULL;
    CREATE INDEX IF NOT EXISTS events_by_job ON events(job);
    CREATE INDEX IF NOT EXISTS trials_by_job ON trials(job) WHERE job != 0;
    CREATE INDEX IF NOT EXISTS jobs_by_search ON jobs(search);
    CREATE INDEX IF NOT EXISTS jobs_ended ON jobs(ended_at) WHERE ended_at > 0;)");
}

void StateStore::AddColumnIfMissing(const std::string& table, const std::string& column,
                                    const std::string& declaration) {
  if (!HasColumn(table, column)) Exec("ALTER TABLE " + table + " ADD COLUMN " + column + " " + declaration);
}

void StateStore::KeepWorldToken(const std::string& world, const std::string& token, double now) {
  Statement s(*statements_, "INSERT OR IGNORE INTO worlds(world, token, registered_at) VALUES(?, ?, ?)");
  s.Bind(1, world).Bind(2, token).Bind(3, now);
  s.Step();
}

std::map<std::string, std::string> StateStore::WorldTokens() const {
  std::map<std::string, std::string> tokens;
  Statement s(*statements_, "SELECT world, token FROM worlds");
  while (s.Step()) tokens[s.Text(0)] = s.Text(1);
  return tokens;
}

void StateStore::TouchWorlds(const std::vector<std::string>& worlds, double now) {
  Transaction transaction(*this);
  for (const std::string& world : worlds) {
    Statement s(*statements_, "UPDATE worlds SET registered_at = ? WHERE world = ?");
    s.Bind(1, now).Bind(2, world);
    s.Step();
  }
  transaction.Commit();
}

std::optional<ElasticOptions> StateStore::ElasticOptionsOf(int64_t job) const {
  Statement s(*statements_,
              "SELECT min_replicas, max_replicas, join_window_s, timeout_s FROM elastic_jobs "
              "WHERE job = ? AND max_replicas > 0");
  s.Bind(1, job);
  if (!s.Step()) return std::nullopt;
  return ElasticOptions{int(s.Int(0)), int(s.Int(1)), s.Real(2), s.Real(3)};
}

uint64_t StateStore::LastQuorumId(int64_t job) const {
  Statement s(*statements_, "SELECT last_quorum_id FROM elastic_jobs WHERE job = ?");
  s.Bind(1, job);
  return s.Step() ? static_cast<uint64_t>(s.Int(0)) : 0;
}

void StateStore::KeepQuorumId(int64_t job, uint64_t id) {
  Statement s(*statements_,
              "INSERT INTO elastic_jobs(job, last_quorum_id) VALUES(?, ?) "
              "ON CONFLICT(job) DO UPDATE SET last_quorum_id = MAX(last_quorum_id, excluded.last_quorum_id)");
  s.Bind(1, job).Bind(2, static_cast<int64_t>(id));
  s.Step();
}

void StateStore::ForgetWorldsRegisteredBefore(double before) {
  // A placement names a world as "<world>:<rank>", after a comma or at the start.
  Statement s(*statements_,
              "DELETE FROM worlds WHERE registered_at < ? AND NOT EXISTS (SELECT 1 FROM attempts WHERE "
              "ended_at IS NULL AND instr(',' || placement, ',' || world || ':') > 0)");
  s.Bind(1, before);
  s.Step();
}

std::string StateStore::journal_mode() const {
  Statement s(*statements_, "PRAGMA journal_mode");
  return s.Step() ? s.Text(0) : "";
}

std::optional<JobRecord> StateStore::FindByKey(const std::string& user, const std::string& key) const {
  if (key.empty()) return std::nullopt;
  Statement existing(*statements_, std::string("SELECT ") + kJobColumns + " FROM jobs WHERE idempotency_key = ?");
  existing.Bind(1, user + "/" + key);
  if (!existing.Step()) return std::nullopt;
  return ReadJob(existing);
}

JobRecord StateStore::Submit(const NewJob& job, double now, bool* created) {
  if (auto existing = FindByKey(job.user, job.idempotency_key)) {
    *created = false;
    return *existing;
  }
  const std::string scoped_key = job.idempotency_key.empty() ? "" : job.user + "/" + job.idempotency_key;
  Statement insert(*statements_,
                   "INSERT INTO jobs(name, idempotency_key, spec_yaml, source, state, priority, ranks, "
                   "max_restarts, device, submitted_at, base_dir, estimate_s, user, preemptible, search, kind, metric) "
                   "VALUES(?, NULLIF(?, ''), ?, ?, 'QUEUED', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  insert.Bind(1, job.name).Bind(2, scoped_key).Bind(3, job.spec_yaml).Bind(4, job.source);
  insert.Bind(5, int64_t(job.priority)).Bind(6, int64_t(job.ranks)).Bind(7, int64_t(job.max_restarts));
  insert.Bind(8, job.device).Bind(9, now).Bind(10, job.base_dir).Bind(11, job.estimate_s).Bind(12, job.user);
  insert.Bind(13, int64_t(job.preemptible ? 1 : 0)).Bind(14, job.search);
  insert.Bind(15, std::string(job.is_search ? "search" : "")).Bind(16, job.metric);
  Transaction transaction(*this);
  insert.Step();
  *created = true;
  const int64_t id = sqlite3_last_insert_rowid(db_);
  if (job.elastic.max_replicas > 0) {
    Statement elastic(*statements_,
                      "INSERT INTO elastic_jobs(job, min_replicas, max_replicas, join_window_s, timeout_s) "
                      "VALUES(?, ?, ?, ?, ?)");
    elastic.Bind(1, id).Bind(2, int64_t(job.elastic.min_replicas)).Bind(3, int64_t(job.elastic.max_replicas));
    elastic.Bind(4, job.elastic.join_window_s).Bind(5, job.elastic.timeout_s);
    elastic.Step();
  }
  transaction.Commit();
  UpdateQueued(id);
  return *Find(id);
}

std::optional<JobRecord> StateStore::Find(int64_t id) const {
  Statement s(*statements_, std::string("SELECT ") + kJobColumns + " FROM jobs WHERE id = ?");
  s.Bind(1, id);
  if (!s.Step()) return std::nullopt;
  return ReadJob(s);
}

std::vector<JobRecord> StateStore::Jobs() const {
  Statement s(*statements_, std::string("SELECT ") + kListedJobColumns + " FROM jobs ORDER BY id");
  std::vector<JobRecord> out;
  while (s.Step()) out.push_back(ReadJob(s));
  return out;
}

// Note [The queue in memory]
// A scheduling pass reads every queued job, up to twice a second; with tens of thousands
// queued, reading them from SQLite was most of the pass. So the store keeps the queued
// jobs' listed rows (no job file) in memory, read once, and every method that writes a
// job's state or its scheduling fields (Submit, SetState, StartAttempt, Requeue) updates
// the copy in the same call, after its statement succeeded. Each of those is the only
// writer of the jobs table's state, so the copy equals `WHERE state = 'QUEUED'` as this
// connection sees it. A rolled-back transaction may have undone updates already applied
// to the copy, so a rollback drops it, and the next Queued() reads it afresh.
const std::map<int64_t, JobRecord>& StateStore::Queued() const {
  if (!queued_) {
    std::map<int64_t, JobRecord> queued;  // kept only once whole: a failed read leaves none
    Statement s(*statements_, std::string("SELECT ") + kListedJobColumns + " FROM jobs WHERE state = 'QUEUED'");
    while (s.Step()) {
      JobRecord job = ReadJob(s);
      const int64_t id = job.id;
      queued.emplace(id, std::move(job));
    }
    queued_ = std::move(queued);
  }
  return *queued_;
}

void StateStore::UpdateQueued(int64_t id) {
  if (!queued_) return;
  Statement s(*statements_,
              std::string("SELECT ") + kListedJobColumns + " FROM jobs WHERE id = ? AND state = 'QUEUED'");
  s.Bind(1, id);
  if (s.Step())
    queued_->insert_or_assign(id, ReadJob(s));
  else
    queued_->erase(id);
}

std::vector<JobRecord> StateStore::JobsIn(JobState state) const {
  if (state == JobState::kQueued) {
    std::vector<JobRecord> out;
    out.reserve(Queued().size());
    for (const auto& [id, job] : Queued()) out.push_back(job);
    return out;
  }
  Statement s(*statements_, std::string("SELECT ") + kListedJobColumns + " FROM jobs WHERE state = ? ORDER BY id");
  s.Bind(1, std::string(ToString(state)));
  std::vector<JobRecord> out;
  while (s.Step()) out.push_back(ReadJob(s));
  return out;
}

void StateStore::SetState(int64_t id, JobState state, const std::string& reason, double now) {
  const bool final_state = state == JobState::kSucceeded || state == JobState::kFailed ||
                           state == JobState::kCancelled || state == JobState::kStopped;
  Statement s(*statements_, "UPDATE jobs SET state = ?, reason = ?, ended_at = ? WHERE id = ?");
  s.Bind(1, std::string(ToString(state))).Bind(2, reason).Bind(3, final_state ? now : 0.0).Bind(4, id);
  s.Step();
  UpdateQueued(id);
}

int StateStore::StartAttempt(int64_t id, const std::string& placement, double now) {
  Transaction transaction(*this);
  Statement bump(*statements_, "UPDATE jobs SET attempts = attempts + 1, state = 'RUNNING' WHERE id = ?");
  bump.Bind(1, id);
  bump.Step();
  UpdateQueued(id);
  const int attempt = Find(id)->attempts;
  Statement insert(*statements_, "INSERT INTO attempts(job, attempt, placement, started_at) VALUES(?, ?, ?, ?)");
  insert.Bind(1, id).Bind(2, int64_t(attempt)).Bind(3, placement).Bind(4, now);
  insert.Step();
  transaction.Commit();
  return attempt;
}

void StateStore::EndAttempt(int64_t id, int attempt, wire::Outcome end, const std::string& reason, double now) {
  Statement was(*statements_,
                "SELECT j.user, a.ranks, a.ran_from, a.ended_at IS NULL FROM attempts a JOIN jobs j ON j.id = a.job "
                "WHERE a.job = ? AND a.attempt = ?");
  was.Bind(1, id).Bind(2, int64_t(attempt));
  const bool found = was.Step();
  Statement s(*statements_,
              "UPDATE attempts SET ended_at = ?, outcome = ?, end_reason = ? WHERE job = ? AND attempt = ?");
  s.Bind(1, now).Bind(2, OutcomeName(end)).Bind(3, reason).Bind(4, id).Bind(5, int64_t(attempt));
  s.Step();
  if (!ended_usage_ || !found) return;
  if (was.Int(3) == 0)  // ended again: its end moved, so the totals are read afresh
    ended_usage_.reset();
  else if (was.Real(2) > 0)
    ended_usage_->AddEnded(was.Text(0), double(was.Int(1)), was.Real(2), now);
}

void StateStore::StartUsage(int64_t id, int attempt, double ran_from, int ranks, int gpus) {
  Statement s(*statements_,
              "UPDATE attempts SET ran_from = ?, ranks = ?, gpus = ? WHERE job = ? AND attempt = ? AND ran_from = 0");
  s.Bind(1, ran_from).Bind(2, int64_t(ranks)).Bind(3, int64_t(gpus)).Bind(4, id).Bind(5, int64_t(attempt));
  s.Step();
}

void StateStore::MarkPreempted(int64_t id, int attempt, int64_t by) {
  Statement s(*statements_, "UPDATE attempts SET preempted_by = ? WHERE job = ? AND attempt = ?");
  s.Bind(1, by).Bind(2, id).Bind(3, int64_t(attempt));
  s.Step();
}

void StateStore::SetPlacement(int64_t id, int attempt, const std::string& placement) {
  Statement s(*statements_, "UPDATE attempts SET placement = ? WHERE job = ? AND attempt = ?");
  s.Bind(1, placement).Bind(2, id).Bind(3, int64_t(attempt));
  s.Step();
}

std::vector<Usage> StateStore::UsageBy(bool per_user, double now) const {
  const std::string user = per_user ? "j.user" : "''";
  Statement s(*statements_,
              "SELECT " + user +
                  ", COUNT(DISTINCT a.job), COUNT(*), "
                  "SUM(a.ranks * MAX(0, IFNULL(a.ended_at, ?1) - a.ran_from)), "
                  "SUM(a.gpus * MAX(0, IFNULL(a.ended_at, ?1) - a.ran_from)) "
                  "FROM attempts a JOIN jobs j ON j.id = a.job WHERE a.ran_from > 0 GROUP BY 1 ORDER BY 1");
  s.Bind(1, now);
  std::map<std::string, Usage> by_user;
  while (s.Step()) by_user[s.Text(0)] = {s.Text(0), s.Int(1), s.Int(2), s.Real(3), s.Real(4)};
  // Note [History retention]: the forgotten jobs' usage.
  const auto add_forgotten = [&](const char* kind, auto field) {
    for (const auto& [user_key, value] : HistoryTotals(kind)) {
      Usage& u = by_user[per_user ? user_key.first : ""];
      u.user = per_user ? user_key.first : "";
      field(u, value);
    }
  };
  add_forgotten("usage_jobs", [](Usage& u, double v) { u.jobs += int64_t(v); });
  add_forgotten("usage_attempts", [](Usage& u, double v) { u.attempts += int64_t(v); });
  add_forgotten("rank_seconds", [](Usage& u, double v) { u.rank_seconds += v; });
  add_forgotten("gpu_seconds", [](Usage& u, double v) { u.gpu_seconds += v; });
  std::vector<Usage> out;
  out.reserve(by_user.size());
  for (auto& [user_name, u] : by_user) out.push_back(std::move(u));
  return out;
}

void StateStore::LoadEndedUsage(double half_life_s) const {
  Statement s(*statements_,
              "SELECT j.user, a.ranks, a.ran_from, a.ended_at FROM attempts a JOIN jobs j ON j.id = a.job "
              "WHERE a.ran_from > 0 AND a.ended_at IS NOT NULL");
  ended_usage_.emplace(half_life_s);
  while (s.Step()) ended_usage_->AddEnded(s.Text(0), double(s.Int(1)), s.Real(2), s.Real(3));
  Statement folded(*statements_, "SELECT user, value, as_of FROM history_totals WHERE kind = 'fairshare'");
  while (folded.Step()) ended_usage_->AddTotal(folded.Text(0), folded.Real(1), folded.Real(2));
}

std::map<std::string, double> StateStore::DecayedRankSeconds(double now, double half_life_s) const {
  if (!ended_usage_ || ended_usage_->half_life_s() != half_life_s) LoadEndedUsage(half_life_s);
  std::map<std::string, double> usage = ended_usage_->At(now);
  Statement running(*statements_,
                    "SELECT j.user, a.ranks, a.ran_from FROM attempts a JOIN jobs j ON j.id = a.job "
                    "WHERE a.ended_at IS NULL AND a.ran_from > 0");
  while (running.Step())
    if (running.Real(2) < now)
      usage[running.Text(0)] += DecayedUsage::Of(double(running.Int(1)), running.Real(2), now, now, half_life_s);
  return usage;
}

double AttemptRecord::RankSeconds(double now) const {
  return ran_from > 0 ? ranks * std::max(0.0, (ended_at > 0 ? ended_at : now) - ran_from) : 0;
}

double AttemptRecord::GpuSeconds(double now) const {
  return ran_from > 0 ? gpus * std::max(0.0, (ended_at > 0 ? ended_at : now) - ran_from) : 0;
}

void StateStore::Requeue(int64_t id, const std::string& reason, double not_before) {
  Statement s(*statements_, "UPDATE jobs SET state = 'QUEUED', reason = ?, not_before = ? WHERE id = ?");
  s.Bind(1, reason).Bind(2, not_before).Bind(3, id);
  s.Step();
  UpdateQueued(id);
}

namespace {

constexpr const char* kAttemptColumns =
    "job, attempt, placement, started_at, IFNULL(ended_at, 0), IFNULL(outcome, ''), end_reason, ran_from, ranks, "
    "gpus, preempted_by";

AttemptRecord ReadAttemptRow(const Statement& s) {
  AttemptRecord a;
  a.job = s.Int(0);
  a.attempt = int(s.Int(1));
  a.placement = s.Text(2);
  a.started_at = s.Real(3);
  a.ended_at = s.Real(4);
  a.end = OutcomeFromName(s.Text(5));
  a.end_reason = s.Text(6);
  a.ran_from = s.Real(7);
  a.ranks = int(s.Int(8));
  a.gpus = int(s.Int(9));
  a.preempted_by = s.Int(10);
  return a;
}

}  // namespace

std::vector<AttemptRecord> StateStore::Attempts(int64_t id) const {
  Statement s(*statements_, std::string("SELECT ") + kAttemptColumns + " FROM attempts WHERE job = ? ORDER BY attempt");
  s.Bind(1, id);
  std::vector<AttemptRecord> out;
  while (s.Step()) out.push_back(ReadAttemptRow(s));
  return out;
}

std::vector<AttemptRecord> StateStore::OpenAttempts() const {
  Statement s(*statements_,
              std::string("SELECT ") + kAttemptColumns + " FROM attempts WHERE ended_at IS NULL ORDER BY job, attempt");
  std::vector<AttemptRecord> out;
  while (s.Step()) out.push_back(ReadAttemptRow(s));
  return out;
}

bool StateStore::AddEpochRow(int64_t id, const EpochRecord& row) {
  Statement s(*statements_,
              "INSERT OR IGNORE INTO epochs(job, epoch, attempt, csv_line, csv_header, breakdown_json) "
              "VALUES(?, ?, ?, ?, ?, ?)");
  s.Bind(1, id).Bind(2, int64_t(row.epoch)).Bind(3, int64_t(row.attempt)).Bind(4, row.csv_line);
  s.Bind(5, row.csv_header).Bind(6, row.breakdown_json);
  s.Step();
  return sqlite3_changes(db_) == 1;
}

std::vector<EpochRecord> StateStore::EpochRows(int64_t id) const {
  Statement s(*statements_, std::string("SELECT ") + kEpochColumns + " FROM epochs WHERE job = ? ORDER BY epoch");
  s.Bind(1, id);
  std::vector<EpochRecord> out;
  while (s.Step()) out.push_back(ReadEpochRow(s));
  return out;
}

namespace {

// The WHERE clause of a job listing, with a '?' for each value BindFilter binds.
std::string FilterClause(const JobFilter& filter, bool paged) {
  std::string sql = " WHERE 1";
  if (!filter.states.empty()) {
    sql += " AND state IN (?";
    for (size_t i = 1; i < filter.states.size(); ++i) sql += ", ?";
    sql += ")";
  }
  if (!filter.user.empty()) sql += " AND user = ?";
  if (!filter.name_contains.empty()) sql += " AND instr(name, ?) > 0";
  if (paged && filter.before_id > 0) sql += " AND id < ?";
  return sql;
}

// Binds FilterClause's values from 1 on; returns the last index bound.
int BindFilter(const JobFilter& filter, bool paged, Statement* s) {
  int bound = 0;
  for (JobState state : filter.states) s->Bind(++bound, std::string(ToString(state)));
  if (!filter.user.empty()) s->Bind(++bound, filter.user);
  if (!filter.name_contains.empty()) s->Bind(++bound, filter.name_contains);
  if (paged && filter.before_id > 0) s->Bind(++bound, filter.before_id);
  return bound;
}

}  // namespace

std::vector<JobRecord> StateStore::JobsMatching(const JobFilter& filter) const {
  std::string sql =
      std::string("SELECT ") + kListedJobColumns + " FROM jobs" + FilterClause(filter, true) + " ORDER BY id DESC";
  if (filter.limit > 0) sql += " LIMIT ?";
  Statement s(*statements_, sql);
  const int bound = BindFilter(filter, true, &s);
  if (filter.limit > 0) s.Bind(bound + 1, filter.limit);
  std::vector<JobRecord> out;
  while (s.Step()) out.push_back(ReadJob(s));
  return out;
}

int64_t StateStore::CountMatching(const JobFilter& filter) const {
  Statement s(*statements_, "SELECT COUNT(*) FROM jobs" + FilterClause(filter, false));
  BindFilter(filter, false, &s);
  s.Step();
  return s.Int(0);
}

std::optional<EpochRecord> StateStore::NewestEpochRow(int64_t id) const {
  Statement s(*statements_,
              std::string("SELECT ") + kEpochColumns + " FROM epochs WHERE job = ? ORDER BY epoch DESC LIMIT 1");
  s.Bind(1, id);
  if (!s.Step()) return std::nullopt;
  return ReadEpochRow(s);
}

std::optional<EpochRecord> StateStore::NewestRowWith(int64_t id, const std::string& column) const {
  // A header is its column names joined by commas (epochs.csv's first line).
  Statement s(*statements_, std::string("SELECT ") + kEpochColumns + " FROM epochs WHERE job = ? AND " +
                                "instr(',' || csv_header || ',', ',' || ? || ',') > 0 ORDER BY epoch DESC LIMIT 1");
  s.Bind(1, id).Bind(2, column);
  if (!s.Step()) return std::nullopt;
  return ReadEpochRow(s);
}

void StateStore::AddEvent(int64_t id, const std::string& text, double now) {
  Statement s(*statements_, "INSERT INTO events(job, at, text) VALUES(?, ?, ?)");
  s.Bind(1, id).Bind(2, now).Bind(3, text);
  s.Step();
}

std::vector<std::string> StateStore::Events(int64_t id) const {
  Statement s(*statements_, "SELECT text FROM events WHERE job = ? ORDER BY rowid");
  s.Bind(1, id);
  std::vector<std::string> out;
  while (s.Step()) out.push_back(s.Text(0));
  return out;
}

std::vector<EventRecord> StateStore::TimedEvents(int64_t id) const {
  Statement s(*statements_, "SELECT at, text FROM events WHERE job = ? ORDER BY rowid");
  s.Bind(1, id);
  std::vector<EventRecord> out;
  while (s.Step()) out.push_back({s.Real(0), s.Text(1)});
  return out;
}

std::map<std::pair<std::string, std::string>, int64_t> StateStore::JobCountsByStateAndUser() const {
  Statement s(*statements_, "SELECT state, user, COUNT(*) FROM jobs GROUP BY state, user");
  std::map<std::pair<std::string, std::string>, int64_t> out;
  while (s.Step()) out[{s.Text(0), s.Text(1)}] = s.Int(2);
  for (const auto& [user_state, count] : HistoryTotals("jobs"))
    out[{user_state.second, user_state.first}] += int64_t(count);
  return out;
}

std::vector<double> StateStore::SecondsToFirstStart() const {
  Statement s(*statements_,
              "SELECT MAX(0, MIN(a.started_at) - j.submitted_at) FROM attempts a JOIN jobs j ON j.id = a.job "
              "GROUP BY a.job");
  std::vector<double> out;
  while (s.Step()) out.push_back(s.Real(0));
  return out;
}

std::map<wire::Outcome, int64_t> StateStore::AttemptOutcomes() const {
  Statement s(*statements_, "SELECT outcome, COUNT(*) FROM attempts WHERE ended_at IS NOT NULL GROUP BY outcome");
  std::map<wire::Outcome, int64_t> out;
  while (s.Step()) out[OutcomeFromName(s.Text(0))] += s.Int(1);
  for (const auto& [user_outcome, count] : HistoryTotals("outcomes"))
    out[OutcomeFromName(user_outcome.second)] += int64_t(count);
  return out;
}

// --- Searches (coordinator/search.h) ---

namespace {

std::string JoinInts(const std::vector<int>& values) {
  std::string out;
  for (int v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

std::vector<int> SplitInts(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

constexpr const char* kTrialColumns =
    "search, trial, name, params_json, yaml, base_dir, source, priority, ranks, max_restarts, device, estimate_s, "
    "preemptible, job, stopped_at";

TrialRecord ReadTrial(const Statement& s) {
  TrialRecord t;
  t.search = s.Int(0);
  t.trial = int(s.Int(1));
  t.name = s.Text(2);
  t.params_json = s.Text(3);
  t.yaml = s.Text(4);
  t.base_dir = s.Text(5);
  t.source = s.Text(6);
  t.job_fields.priority = int(s.Int(7));
  t.job_fields.ranks = int(s.Int(8));
  t.job_fields.max_restarts = int(s.Int(9));
  t.job_fields.device = s.Text(10);
  t.job_fields.estimate_s = s.Real(11);
  t.job_fields.preemptible = s.Int(12) != 0;
  t.job = s.Int(13);
  t.stopped_at = int(s.Int(14));
  return t;
}

}  // namespace

void StateStore::AddSearch(const SearchRecord& search, const std::vector<TrialRecord>& trials) {
  Transaction transaction(*this);
  Statement s(*statements_,
              "INSERT INTO searches(job, method, metric, maximize, eta, max_epochs, max_concurrent, rungs) "
              "VALUES(?, ?, ?, ?, ?, ?, ?, ?)");
  s.Bind(1, search.job).Bind(2, search.method).Bind(3, search.metric).Bind(4, int64_t(search.maximize));
  s.Bind(5, int64_t(search.eta)).Bind(6, int64_t(search.max_epochs)).Bind(7, int64_t(search.max_concurrent));
  s.Bind(8, JoinInts(search.rungs));
  s.Step();
  for (const TrialRecord& t : trials) {
    Statement insert(*statements_, std::string("INSERT INTO trials(") + kTrialColumns +
                                       ") VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0)");
    insert.Bind(1, search.job).Bind(2, int64_t(t.trial)).Bind(3, t.name).Bind(4, t.params_json).Bind(5, t.yaml);
    insert.Bind(6, t.base_dir).Bind(7, t.source).Bind(8, int64_t(t.job_fields.priority));
    insert.Bind(9, int64_t(t.job_fields.ranks)).Bind(10, int64_t(t.job_fields.max_restarts));
    insert.Bind(11, t.job_fields.device).Bind(12, t.job_fields.estimate_s);
    insert.Bind(13, int64_t(t.job_fields.preemptible));
    insert.Step();
  }
  transaction.Commit();
}

std::optional<SearchRecord> StateStore::FindSearch(int64_t job) const {
  Statement s(*statements_,
              "SELECT job, method, metric, maximize, eta, max_epochs, max_concurrent, rungs FROM searches "
              "WHERE job = ?");
  s.Bind(1, job);
  if (!s.Step()) return std::nullopt;
  SearchRecord r;
  r.job = s.Int(0);
  r.method = s.Text(1);
  r.metric = s.Text(2);
  r.maximize = s.Int(3) != 0;
  r.eta = int(s.Int(4));
  r.max_epochs = int(s.Int(5));
  r.max_concurrent = int(s.Int(6));
  r.rungs = SplitInts(s.Text(7));
  return r;
}

std::vector<TrialRecord> StateStore::Trials(int64_t search) const {
  Statement s(*statements_, std::string("SELECT ") + kTrialColumns + " FROM trials WHERE search = ? ORDER BY trial");
  s.Bind(1, search);
  std::vector<TrialRecord> out;
  while (s.Step()) out.push_back(ReadTrial(s));
  return out;
}

std::optional<TrialRecord> StateStore::TrialOfJob(int64_t job) const {
  Statement s(*statements_, std::string("SELECT ") + kTrialColumns + " FROM trials WHERE job = ? AND job != 0");
  s.Bind(1, job);
  if (!s.Step()) return std::nullopt;
  return ReadTrial(s);
}

void StateStore::SetTrialJob(int64_t search, int trial, int64_t job) {
  Statement s(*statements_, "UPDATE trials SET job = ? WHERE search = ? AND trial = ?");
  s.Bind(1, job).Bind(2, search).Bind(3, int64_t(trial));
  s.Step();
}

void StateStore::SetTrialStopped(int64_t search, int trial, int epoch) {
  Statement s(*statements_, "UPDATE trials SET stopped_at = ? WHERE search = ? AND trial = ?");
  s.Bind(1, int64_t(epoch)).Bind(2, search).Bind(3, int64_t(trial));
  s.Step();
}

bool StateStore::AddRungResult(int64_t search, int epoch, const RungResult& result, double now) {
  Statement s(*statements_,
              "INSERT OR IGNORE INTO rung_results(search, epoch, trial, value, promoted, at) VALUES(?, ?, ?, ?, ?, ?)");
  s.Bind(1, search).Bind(2, int64_t(epoch)).Bind(3, int64_t(result.trial));
  s.Bind(4, result.value).Bind(5, int64_t(result.promoted)).Bind(6, now);
  s.Step();
  return sqlite3_changes(db_) > 0;
}

std::vector<RungResult> StateStore::RungResults(int64_t search, int epoch) const {
  Statement s(*statements_,
              "SELECT trial, value, promoted FROM rung_results WHERE search = ? AND epoch = ? ORDER BY rowid");
  s.Bind(1, search).Bind(2, int64_t(epoch));
  std::vector<RungResult> out;
  while (s.Step())  // SQLite stores a NaN as NULL
    out.push_back({int(s.Int(0)), s.IsNull(1) ? std::numeric_limits<double>::quiet_NaN() : s.Real(1), s.Int(2) != 0});
  return out;
}

int64_t FullScanSteps() { return full_scan_steps.load(); }

}  // namespace trainyard
