// The state store on a real SQLite file.
#include "coordinator/state_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/common/source_path.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class StateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_store_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "state.db").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static NewJob Job(const std::string& key) {
    NewJob j;
    j.name = "langid";
    j.idempotency_key = key;
    j.spec_yaml = "name: langid\n";
    j.source = "job.yaml";
    j.ranks = 2;
    return j;
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(StateStoreTest, TransactionCommitsTogetherOrRollsBackOnAnException) {
  int64_t id = 0;
  {
    StateStore store(path_, false);
    bool created = false;
    id = store.Submit(Job("a"), 1.0, &created).id;
    try {
      StateStore::Transaction transaction(store);
      const int attempt = store.StartAttempt(id, "w:0,1", 2.0);  // nested: commits with the outer one
      store.EndAttempt(id, attempt, wire::OUTCOME_FAILED, "boom", 3.0);
      store.AddEvent(id, "attempt 1 failed", 3.0);
      throw std::runtime_error("killed between the writes");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(store.Find(id)->state, JobState::kQueued);
    EXPECT_EQ(store.Find(id)->attempts, 0);
    EXPECT_TRUE(store.Attempts(id).empty());
    EXPECT_TRUE(store.Events(id).empty());
    StateStore::Transaction transaction(store);
    store.EndAttempt(id, store.StartAttempt(id, "w:0,1", 2.0), wire::OUTCOME_SUCCEEDED, "", 4.0);
    store.SetState(id, JobState::kSucceeded, "", 5.0);
    transaction.Commit();
  }
  StateStore reopened(path_, false);
  EXPECT_EQ(reopened.Find(id)->state, JobState::kSucceeded);
  ASSERT_EQ(reopened.Attempts(id).size(), 1u);
  EXPECT_EQ(reopened.Attempts(id)[0].end, wire::OUTCOME_SUCCEEDED);
}

TEST_F(StateStoreTest, UsesWalAndKeepsJobsAcrossReopen) {
  {
    StateStore store(path_, false);
    EXPECT_EQ(store.journal_mode(), "wal");
    bool created = false;
    store.Submit(Job("a"), 1.0, &created);
    store.Submit(Job("b"), 2.0, &created);
    store.StartAttempt(1, "world w ranks 0,1", 3.0);
  }
  StateStore reopened(path_, false);
  auto jobs = reopened.Jobs();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].state, JobState::kRunning);
  EXPECT_EQ(jobs[0].attempts, 1);
  EXPECT_EQ(jobs[1].state, JobState::kQueued);
  EXPECT_EQ(jobs[1].ranks, 2);
}

TEST_F(StateStoreTest, SameIdempotencyKeyMakesOneJob) {
  StateStore store(path_, false);
  bool created = false;
  JobRecord first = store.Submit(Job("key-1"), 1.0, &created);
  EXPECT_TRUE(created);
  JobRecord again = store.Submit(Job("key-1"), 2.0, &created);
  EXPECT_FALSE(created);
  EXPECT_EQ(first.id, again.id);
  EXPECT_EQ(store.Jobs().size(), 1u);
}

TEST_F(StateStoreTest, AnIdempotencyKeyIsScopedByItsOwner) {
  StateStore store(path_, false);
  bool created = false;
  NewJob bobs = Job("shared-key"), alices = Job("shared-key");
  bobs.user = "bob";
  alices.user = "alice";
  const JobRecord bob = store.Submit(bobs, 1.0, &created);
  ASSERT_TRUE(created);
  const JobRecord alice = store.Submit(alices, 2.0, &created);
  EXPECT_TRUE(created) << "alice's submission was taken for bob's job " << bob.id;
  EXPECT_NE(alice.id, bob.id);
  EXPECT_EQ(alice.user, "alice");
  EXPECT_EQ(store.Submit(alices, 3.0, &created).id, alice.id);
  EXPECT_FALSE(created);
  EXPECT_EQ(store.Jobs().size(), 2u);
}

// A database of schema version 1 kept the keys as sent; opening it scopes them by owner,
// so a resend after the upgrade still finds its job, and the version becomes 2.
TEST_F(StateStoreTest, AVersionOneDatabaseHasItsKeysScopedByOwner) {
  {
    StateStore old(path_, false);
    bool created = false;
    NewJob job = Job("resent-key");
    job.user = "carol";
    old.Submit(job, 1.0, &created);
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE jobs SET idempotency_key = 'resent-key'; PRAGMA user_version = 1;", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  StateStore store(path_, false);
  bool created = true;
  NewJob resend = Job("resent-key");
  resend.user = "carol";
  EXPECT_EQ(store.Submit(resend, 2.0, &created).id, 1);
  EXPECT_FALSE(created);
  NewJob other = Job("resent-key");
  other.user = "dave";
  store.Submit(other, 3.0, &created);
  EXPECT_TRUE(created);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* version = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &version, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(version), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(version, 0), 4);
  sqlite3_finalize(version);
  sqlite3_close(db);
}

TEST_F(StateStoreTest, EpochRowsAreNeverDuplicated) {
  StateStore store(path_, false);
  bool created = false;
  store.Submit(Job("k"), 1.0, &created);
  EXPECT_TRUE(store.AddEpochRow(1, {1, 2, "2,2.0", "", ""}));
  EXPECT_TRUE(store.AddEpochRow(1, {1, 1, "1,2.0", "", ""}));
  EXPECT_FALSE(store.AddEpochRow(1, {1, 1, "1,2.0", "", ""}));  // a resent report
  EXPECT_FALSE(store.AddEpochRow(1, {2, 2, "2,9.9", "", ""}));  // a later attempt replaying a done epoch
  EXPECT_TRUE(store.AddEpochRow(1, {2, 3, "3,2.1", "", ""}));
  auto rows = store.EpochRows(1);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].epoch, 1);  // epoch order, whatever the arrival order
  EXPECT_EQ(rows[1].csv_line, "2,2.0");
  EXPECT_EQ(rows[2].attempt, 2);
}

TEST_F(StateStoreTest, OpenAttemptsAreWhatARestartReadopts) {
  StateStore store(path_, false);
  bool created = false;
  store.Submit(Job("a"), 1.0, &created);
  store.Submit(Job("b"), 1.0, &created);
  store.StartAttempt(1, "w:0,1", 2.0);
  store.StartAttempt(2, "w:2,3", 2.0);
  store.EndAttempt(1, 1, wire::OUTCOME_SUCCEEDED, "", 3.0);
  auto open = store.OpenAttempts();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].job, 2);
  EXPECT_EQ(open[0].placement, "w:2,3");
  EXPECT_EQ(store.Attempts(1).at(0).end, wire::OUTCOME_SUCCEEDED);
  EXPECT_EQ(open[0].end, wire::OUTCOME_UNSPECIFIED);
}

TEST_F(StateStoreTest, RequeueAndFailureKeepTheReason) {
  StateStore store(path_, false);
  bool created = false;
  store.Submit(Job("k"), 1.0, &created);
  store.StartAttempt(1, "w:0,1", 2.0);
  store.EndAttempt(1, 1, wire::OUTCOME_FAILED, "rank 1 killed by signal 9", 3.0);
  store.Requeue(1, "attempt 1: rank 1 killed by signal 9", 13.0);
  store.AddEvent(1, "requeued", 3.0);
  auto job = *store.Find(1);
  EXPECT_EQ(job.state, JobState::kQueued);
  EXPECT_DOUBLE_EQ(job.not_before, 13.0);
  EXPECT_EQ(job.reason, "attempt 1: rank 1 killed by signal 9");
  EXPECT_EQ(store.Events(1), std::vector<std::string>{"requeued"});
}

TEST_F(StateStoreTest, UsageCountsRankAndGpuSecondsFromWhenTheRanksRanPerUser) {
  StateStore store(path_, false);
  bool created = false;
  NewJob a = Job("a"), b = Job("b"), c = Job("c");
  a.user = "ada";
  b.user = "bob";
  c.user = "ada";
  const int64_t ja = store.Submit(a, 0, &created).id, jb = store.Submit(b, 0, &created).id;
  store.Submit(c, 0, &created);  // never runs: no usage
  store.StartAttempt(ja, "w:0,w:1", 10);
  store.StartUsage(ja, 1, 12, 2, 0);  // queued from 10 to 12 (Slurm's queue): not counted
  store.StartUsage(ja, 1, 50, 2, 0);  // only the first start counts
  store.EndAttempt(ja, 1, wire::OUTCOME_FAILED, "x", 22);
  store.StartAttempt(ja, "w:0,w:1", 30);
  store.StartUsage(ja, 2, 30, 2, 2);
  store.EndAttempt(ja, 2, wire::OUTCOME_SUCCEEDED, "", 40);
  store.StartAttempt(jb, "v:0", 100);
  store.StartUsage(jb, 1, 100, 4, 4);  // still running at 105
  EXPECT_DOUBLE_EQ(store.Attempts(ja)[0].RankSeconds(105), 20);
  EXPECT_DOUBLE_EQ(store.Attempts(ja)[1].GpuSeconds(105), 20);
  EXPECT_DOUBLE_EQ(store.Attempts(jb)[0].RankSeconds(105), 20);

  const std::vector<Usage> total = store.UsageBy(false, 105);
  ASSERT_EQ(total.size(), 1u);
  EXPECT_EQ(total[0].jobs, 2);
  EXPECT_EQ(total[0].attempts, 3);
  EXPECT_DOUBLE_EQ(total[0].rank_seconds, 20 + 20 + 20);
  EXPECT_DOUBLE_EQ(total[0].gpu_seconds, 20 + 20);
  const std::vector<Usage> per_user = store.UsageBy(true, 105);
  ASSERT_EQ(per_user.size(), 2u);
  EXPECT_EQ(per_user[0].user, "ada");
  EXPECT_DOUBLE_EQ(per_user[0].rank_seconds, 40);
  EXPECT_EQ(per_user[1].user, "bob");
  EXPECT_DOUBLE_EQ(per_user[1].gpu_seconds, 20);

  // Note [Fair share]: without decay, the rank-seconds; with a half-life of 10 s, ada's
  // 2 ranks from 30 to 40 count as 2 x 10/ln 2 x (2^(-65/10) - 2^(-75/10)) at 105, and
  // so on for each attempt.
  EXPECT_DOUBLE_EQ(store.DecayedRankSeconds(105, 0).at("ada"), 40);
  const double h = 10, ln2 = std::log(2.0);
  const double ada =
      2 * h / ln2 * (std::exp2(-83 / h) - std::exp2(-93 / h)) + 2 * h / ln2 * (std::exp2(-65 / h) - std::exp2(-75 / h));
  EXPECT_NEAR(store.DecayedRankSeconds(105, h).at("ada"), ada, 1e-9);
  EXPECT_NEAR(store.DecayedRankSeconds(105, h).at("bob"), 4 * h / ln2 * (1 - std::exp2(-5 / h)), 1e-9);
}

// Note [Fair share]: the decayed figures kept as running totals while attempts end (read
// between the ends, as the scheduling passes do) equal the closed form summed over every
// attempt, and so does a store opened afresh on the same file. An attempt ended twice
// counts to its last end; one whose end was rolled back is still running.
TEST_F(StateStoreTest, FairShareTotalsKeptAsAttemptsEndEqualTheClosedForm) {
  const double h = 3600, t0 = 1.8e9;
  struct Interval {
    std::string user;
    double ranks, from, to;  // to = 0: still running
  };
  std::vector<Interval> intervals;
  const auto closed_form = [&](double now) {  // ranks x H/ln 2 x (2^(-(now-t1)/H) - 2^(-(now-t0)/H))
    std::map<std::string, double> out;
    for (const Interval& i : intervals) {
      const double to = i.to > 0 ? i.to : now;
      out[i.user] += i.ranks * h / std::log(2.0) * (std::exp2(-(now - to) / h) - std::exp2(-(now - i.from) / h));
    }
    return out;
  };
  const auto expect_equal = [](const std::map<std::string, double>& got, const std::map<std::string, double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [user, value] : want) EXPECT_NEAR(got.at(user), value, 1e-9 * value) << user;
  };
  {
    StateStore store(path_, false);
    bool created = false;
    double now = t0;
    for (int i = 0; i < 60; ++i) {
      NewJob job = Job("k" + std::to_string(i));
      job.user = std::string(1, char('a' + i % 3));
      const int64_t id = store.Submit(job, now, &created).id;
      store.StartAttempt(id, "w:0", now);
      const double from = now + i % 5, ranks = 1 + i % 4;
      store.StartUsage(id, 1, from, int(ranks), 0);
      now += 600 + 97 * (i % 7);
      if (i % 4 == 3) {  // left running
        intervals.push_back({job.user, ranks, from, 0});
        continue;
      }
      store.EndAttempt(id, 1, wire::OUTCOME_SUCCEEDED, "", now);
      if (i == 10)
        store.EndAttempt(id, 1, wire::OUTCOME_SUCCEEDED, "", now + 5);  // ended twice: counts to the last end
      intervals.push_back({job.user, ranks, from, i == 10 ? now + 5 : now});
      if (i == 20) {  // an end rolled back: still running
        const int64_t rolled = store.Submit(Job("rolled"), now, &created).id;
        store.StartAttempt(rolled, "w:0", now);
        store.StartUsage(rolled, 1, now, 2, 0);
        intervals.push_back({"", 2, now, 0});
        try {
          StateStore::Transaction transaction(store);
          store.EndAttempt(rolled, 1, wire::OUTCOME_FAILED, "x", now + 1);
          throw std::runtime_error("rolled back");
        } catch (const std::runtime_error&) {
        }
      }
      if (i % 6 == 0) expect_equal(store.DecayedRankSeconds(now + 10, h), closed_form(now + 10));
    }
    expect_equal(store.DecayedRankSeconds(now + 7200, h), closed_form(now + 7200));
  }
  StateStore reopened(path_, false);
  const double later = t0 + 90 * 86400.0;
  expect_equal(reopened.DecayedRankSeconds(later, h), closed_form(later));
}

// Note [The queue in memory]: after every kind of change, and after a rollback that undid
// changes already applied in memory, Queued() holds exactly the rows SQLite says are queued.
TEST_F(StateStoreTest, TheQueueInMemoryFollowsEveryChangeAndEveryRollback) {
  StateStore store(path_, false);
  const auto expect_in_step = [&](const std::string& after) {
    std::map<int64_t, JobRecord> want;
    for (const JobRecord& job : store.Jobs())
      if (job.state == JobState::kQueued) want.emplace(job.id, job);
    const std::map<int64_t, JobRecord>& got = store.Queued();
    ASSERT_EQ(got.size(), want.size()) << after;
    for (const auto& [id, job] : want) {
      ASSERT_TRUE(got.count(id)) << after << ": job " << id;
      const JobRecord& mine = got.at(id);
      EXPECT_EQ(mine.attempts, job.attempts) << after;
      EXPECT_EQ(mine.reason, job.reason) << after;
      EXPECT_EQ(mine.not_before, job.not_before) << after;
      EXPECT_EQ(mine.user, job.user) << after;
      EXPECT_EQ(mine.priority, job.priority) << after;
      EXPECT_TRUE(mine.spec_yaml.empty()) << after;
    }
  };
  bool created = false;
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    NewJob job = Job("q" + std::to_string(i));
    job.user = i % 2 ? "ana" : "bo";
    job.priority = i;
    ids.push_back(store.Submit(job, 1.0 + i, &created).id);
  }
  expect_in_step("submitted");
  NewJob again = Job("q0");
  again.user = "bo";
  store.Submit(again, 9.0, &created);  // the same owner and key: no new job
  EXPECT_FALSE(created);
  expect_in_step("resubmitted");
  store.StartAttempt(ids[0], "w:0,1", 10.0);
  expect_in_step("started");
  store.Requeue(ids[0], "its host was lost", 40.0);
  expect_in_step("requeued");
  store.SetState(ids[1], JobState::kCancelled, "cancelled by ana", 5.0);
  expect_in_step("cancelled");
  try {
    StateStore::Transaction transaction(store);
    store.StartAttempt(ids[2], "w:0,1", 11.0);
    store.SetState(ids[3], JobState::kFailed, "x", 5.0);
    store.Requeue(ids[0], "changed, then rolled back", 99.0);
    NewJob late = Job("late");
    store.Submit(late, 12.0, &created);
    throw std::runtime_error("killed between the writes");
  } catch (const std::runtime_error&) {
  }
  expect_in_step("rolled back");
  EXPECT_EQ(store.Queued().at(ids[0]).not_before, 40.0);
  StateStore::Transaction transaction(store);
  store.StartAttempt(ids[4], "w:0,1", 13.0);
  store.SetState(ids[5], JobState::kSucceeded, "", 5.0);
  transaction.Commit();
  expect_in_step("committed");
  EXPECT_EQ(store.Queued().size(), 3u);  // jobs 0, 2 and 3
}

// jobctl list's filters: states, an exact owner and a name's substring, newest first,
// and a limit that keeps the newest; pages before an id; counts of every page. Text that
// would be a pattern in SQL's LIKE is plain. Listings leave the job files out.
TEST_F(StateStoreTest, JobsMatchingFiltersByStateUserAndNameNewestFirst) {
  StateStore store(path_, false);
  bool created = false;
  auto submit = [&](const std::string& name, const std::string& user) {
    NewJob j = Job(name + user);
    j.name = name;
    j.user = user;
    return store.Submit(j, 1.0, &created).id;
  };
  const int64_t a1 = submit("bert-lr1e-5", "alice"), b1 = submit("bert-lr3e-5", "bob"),
                a2 = submit("gpt2-small", "alice"), a3 = submit("bert_%", "alice");
  store.SetState(a1, JobState::kSucceeded, "", 5.0);
  store.SetState(a2, JobState::kRunning, "", 5.0);
  auto filter_of = [](std::vector<JobState> states, const std::string& user, const std::string& name, int64_t limit,
                      int64_t before_id) {
    JobFilter filter;
    filter.states = std::move(states);
    filter.user = user;
    filter.name_contains = name;
    filter.limit = limit;
    filter.before_id = before_id;
    return filter;
  };
  auto ids = [&](std::vector<JobState> states, const std::string& user, const std::string& name, int64_t limit,
                 int64_t before_id = 0) {
    std::vector<int64_t> out;
    for (const JobRecord& j : store.JobsMatching(filter_of(states, user, name, limit, before_id))) out.push_back(j.id);
    return out;
  };
  using Ids = std::vector<int64_t>;
  EXPECT_EQ(ids({}, "", "", 0), (Ids{a3, a2, b1, a1}));
  EXPECT_EQ(ids({}, "alice", "", 0), (Ids{a3, a2, a1}));
  EXPECT_EQ(ids({}, "alic", "", 0), Ids{});  // an owner is matched exactly
  EXPECT_EQ(ids({}, "", "bert", 0), (Ids{a3, b1, a1}));
  EXPECT_EQ(ids({}, "", "_%", 0), Ids{a3});  // not LIKE's wildcards
  EXPECT_EQ(ids({JobState::kQueued}, "", "", 0), (Ids{a3, b1}));
  EXPECT_EQ(ids({JobState::kSucceeded, JobState::kRunning}, "alice", "", 0), (Ids{a2, a1}));
  EXPECT_EQ(ids({}, "", "", 2), (Ids{a3, a2}));
  EXPECT_EQ(ids({}, "alice", "bert", 1), Ids{a3});
  // Pages: before a cursor, with the same filters; a count sees every page.
  EXPECT_EQ(ids({}, "", "", 2, a2), (Ids{b1, a1}));
  EXPECT_EQ(ids({}, "alice", "", 0, a3), (Ids{a2, a1}));
  EXPECT_EQ(ids({}, "", "", 0, a1), Ids{});
  EXPECT_EQ(store.CountMatching(filter_of({}, "", "", 2, a2)), 4);
  EXPECT_EQ(store.CountMatching(filter_of({}, "alice", "", 1, a3)), 3);
  EXPECT_EQ(store.CountMatching(filter_of({JobState::kQueued}, "", "bert", 0, 0)), 2);
  EXPECT_EQ(store.CountMatching(filter_of({JobState::kFailed}, "", "", 0, 0)), 0);
  // Listings leave the job files out; Find reads one.
  for (const auto& listing : {store.Jobs(), store.JobsIn(JobState::kQueued), store.JobsMatching({})})
    for (const JobRecord& j : listing) EXPECT_EQ(j.spec_yaml, "") << j.id;
  EXPECT_EQ(store.Find(a1)->spec_yaml, "name: langid\n");
}

// Every query the loop makes per job or per scheduling pass searches an index: with a
// hundred finished jobs stored (their attempts, epochs and events too), none of them
// steps through a whole table, by SQLite's own count.
TEST_F(StateStoreTest, TheLoopsQueriesSearchIndexesInsteadOfScanningTables) {
  StateStore store(path_, false);
  bool created = false;
  int64_t last = 0;
  const auto add = [&](int i, bool finish) {
    NewJob job = Job("k" + std::to_string(i));
    job.user = i % 2 ? "alice" : "bob";
    last = store.Submit(job, 1.0, &created).id;
    const int attempt = store.StartAttempt(last, "w:0", 2.0);
    store.StartUsage(last, attempt, 2.0, 1, 0);
    store.AddEpochRow(last, {attempt, 1, "1,0.5", "epoch,loss", ""});
    store.AddEvent(last, "started", 2.0);
    if (!finish) return;
    store.EndAttempt(last, attempt, wire::OUTCOME_SUCCEEDED, "", 3.0);
    store.SetState(last, JobState::kSucceeded, "", 5.0);
  };
  for (int i = 0; i < 100; ++i) add(i, true);
  add(100, false);  // one running
  JobFilter alices;
  alices.user = "alice";
  alices.limit = 5;
  JobFilter queued;
  queued.states = {JobState::kQueued};

  store.DecayedRankSeconds(4.0, 3600);  // reads the ended attempts' usage once

  const int64_t before = FullScanSteps();
  EXPECT_EQ(store.DecayedRankSeconds(5.0, 3600).size(), 2u);  // then only the running ones
  EXPECT_TRUE(store.Find(last));
  EXPECT_TRUE(store.JobsIn(JobState::kQueued).empty());
  EXPECT_EQ(store.JobsIn(JobState::kRunning).size(), 1u);
  EXPECT_EQ(store.OpenAttempts().size(), 1u);
  EXPECT_EQ(store.Attempts(last).size(), 1u);
  EXPECT_EQ(store.EpochRows(last).size(), 1u);
  EXPECT_TRUE(store.NewestEpochRow(last));
  EXPECT_TRUE(store.NewestRowWith(last, "loss"));
  EXPECT_EQ(store.TimedEvents(last).size(), 1u);
  EXPECT_EQ(store.JobsMatching(alices).size(), 5u);
  EXPECT_EQ(store.CountMatching(queued), 0);
  EXPECT_FALSE(store.TrialOfJob(last));
  EXPECT_EQ(store.PruneHistory(6.0, 7.0, 3600, {1, 10}, 10), 10);  // Note [History retention]
  EXPECT_EQ(FullScanSteps() - before, 0);

  // The count itself: a query on a column with no index steps from each row to the next.
  JobFilter named;
  named.name_contains = "langid";
  EXPECT_EQ(store.CountMatching(named), 91);
  EXPECT_EQ(FullScanSteps() - before, 90);
}

// A job's metric comes from its newest row that has the column, whatever rows without it
// came later; a column's name must match whole, not as part of another's. NewestEpochRow
// is the newest row of all.
TEST_F(StateStoreTest, NewestRowWithAColumnSkipsRowsWithoutIt) {
  StateStore store(path_, false);
  bool created = false;
  const int64_t id = store.Submit(Job("m"), 1.0, &created).id;
  EXPECT_FALSE(store.NewestRowWith(id, "eval_acc"));
  EXPECT_FALSE(store.NewestEpochRow(id));
  store.AddEpochRow(id, {1, 1, "1,0.5,0.8", "epoch,train_loss,eval_acc", ""});
  store.AddEpochRow(id, {1, 2, "2,0.4,0.9", "epoch,train_loss,eval_acc", ""});
  store.AddEpochRow(id, {1, 3, "3,0.3", "epoch,train_loss", ""});
  const auto row = store.NewestRowWith(id, "eval_acc");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->epoch, 2);
  EXPECT_EQ(store.NewestRowWith(id, "train_loss")->epoch, 3);
  EXPECT_EQ(store.NewestEpochRow(id)->csv_line, "3,0.3");
  EXPECT_FALSE(store.NewestRowWith(id, "eval"));
  EXPECT_FALSE(store.NewestRowWith(id, "acc"));
}

TEST_F(StateStoreTest, ADatabaseWithoutTheUsageColumnsGetsThemAndKeepsItsJobs) {
  {  // the tables as a store without usage made them
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, "
                           "idempotency_key TEXT UNIQUE, spec_yaml TEXT NOT NULL, source TEXT NOT NULL, state TEXT "
                           "NOT NULL, priority INTEGER NOT NULL, ranks INTEGER NOT NULL, max_restarts INTEGER NOT "
                           "NULL, attempts INTEGER NOT NULL DEFAULT 0, device TEXT NOT NULL, reason TEXT NOT NULL "
                           "DEFAULT '', submitted_at REAL NOT NULL, not_before REAL NOT NULL DEFAULT 0, base_dir "
                           "TEXT NOT NULL DEFAULT '', estimate_s REAL NOT NULL DEFAULT 0);"
                           "CREATE TABLE attempts(job INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL, "
                           "placement TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL, outcome TEXT, "
                           "PRIMARY KEY(job, attempt));"
                           "INSERT INTO jobs(name, spec_yaml, source, state, priority, ranks, max_restarts, attempts, "
                           "device, submitted_at) VALUES('old', 'name: old', 'old.yaml', 'SUCCEEDED', 0, 1, 0, 1, "
                           "'cpu', 1);"
                           "INSERT INTO attempts VALUES(1, 1, 'w:0', 1, 2, 'succeeded');",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  StateStore store(path_, false);
  ASSERT_EQ(store.Jobs().size(), 1u);
  EXPECT_EQ(store.Jobs()[0].name, "old");
  EXPECT_EQ(store.Jobs()[0].user, "");
  EXPECT_EQ(store.Attempts(1).at(0).ran_from, 0);  // its usage is unknown: not counted
  EXPECT_TRUE(store.UsageBy(false, 10).empty());
}

// Runs `sql` on the database at `path` (made if missing), outside any store.
void ExecOn(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string text = error ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << text;
}

// Each table's columns (name, type, not null, default), sorted, and the schema version.
std::map<std::string, std::vector<std::string>> Layout(const std::string& path, int* version) {
  std::map<std::string, std::vector<std::string>> layout;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(
      db,
      "SELECT m.name, c.name || ' ' || c.type || ' ' || c.\"notnull\" || ' ' || IFNULL(c.dflt_value, '') "
      "FROM sqlite_master m, pragma_table_info(m.name) c WHERE m.type = 'table'",
      -1, &s, nullptr);
  while (sqlite3_step(s) == SQLITE_ROW)
    layout[reinterpret_cast<const char*>(sqlite3_column_text(s, 0))].push_back(
        reinterpret_cast<const char*>(sqlite3_column_text(s, 1)));
  sqlite3_finalize(s);
  sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, nullptr);
  *version = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
  sqlite3_finalize(s);
  sqlite3_close(db);
  for (auto& [table, columns] : layout) std::sort(columns.begin(), columns.end());
  return layout;
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every schema a coordinator has written (tests/coordinator/data/schema_*.sql, each made
// with that version's own table definitions) is brought to this one: the columns of a new
// database, every row kept, outcomes as the enum and its reason, keys scoped by owner,
// and the first layout's epochs one row per epoch.
TEST_F(StateStoreTest, EveryEarlierSchemaIsBroughtToThisOneKeepingItsRows) {
  { StateStore fresh(path_, false); }
  int fresh_version = 0;
  const auto fresh_layout = Layout(path_, &fresh_version);
  EXPECT_EQ(fresh_version, 4);
  int fixtures = 0;
  for (const auto& entry : fs::directory_iterator(SourcePath("tests/coordinator/data"))) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("schema_", 0) != 0) continue;
    SCOPED_TRACE(name);
    ++fixtures;
    const std::string old = (dir_ / (name + ".db")).string();
    const std::string sql = ReadAll(entry.path());
    const bool has_searches = sql.find("CREATE TABLE searches") != std::string::npos;  // and a trial, job 6
    ExecOn(old, sql);
    {
      StateStore store(old, false);
      ASSERT_EQ(store.Jobs().size(), has_searches ? 6u : 4u);
      const auto retried = store.Attempts(1);
      ASSERT_EQ(retried.size(), 2u);
      EXPECT_EQ(retried[0].end, wire::OUTCOME_FAILED);
      EXPECT_EQ(retried[0].end_reason, "job rank 1 (pid 41 on h1) was killed by signal 9 (SIGKILL): out of memory");
      EXPECT_EQ(retried[1].end, wire::OUTCOME_SUCCEEDED);
      EXPECT_EQ(retried[1].end_reason, "");
      const auto requeued = store.Attempts(3);
      ASSERT_EQ(requeued.size(), 2u);
      EXPECT_EQ(requeued[0].end, wire::OUTCOME_INTERRUPTED);
      EXPECT_EQ(requeued[0].end_reason, "its pool went away");
      EXPECT_EQ(requeued[1].end, wire::OUTCOME_ABANDONED);
      EXPECT_EQ(store.Attempts(4).at(0).end, wire::OUTCOME_CANCELLED);
      if (has_searches) {
        EXPECT_EQ(store.Attempts(6).at(0).end, wire::OUTCOME_STOPPED);
      }
      const auto open = store.OpenAttempts();
      ASSERT_EQ(open.size(), 1u);
      EXPECT_EQ(open[0].job, 2);
      EXPECT_EQ(open[0].end, wire::OUTCOME_UNSPECIFIED);
      const auto rows = store.EpochRows(1);
      ASSERT_EQ(rows.size(), 2u);
      EXPECT_EQ(rows[0].csv_line, "1,0.9");  // the first stored row of an epoch is kept
      EXPECT_EQ(rows[1].csv_line, "2,0.5");
      EXPECT_EQ(store.Find(1)->spec_yaml, "name: retried\nkind: finetune\n");
      EXPECT_EQ(store.Events(1).size(), 1u);
      const std::string owner = store.Find(1)->user;
      ASSERT_TRUE(store.FindByKey(owner, "key-1"));
      EXPECT_EQ(store.FindByKey(owner, "key-1")->id, 1);
      EXPECT_FALSE(store.FindByKey(owner + "x", "key-1"));
      // Written to as this version writes.
      store.EndAttempt(2, 1, wire::OUTCOME_PREEMPTED, "a time limit ahead", 140);
      EXPECT_EQ(store.AttemptOutcomes().at(wire::OUTCOME_PREEMPTED), 1);
      EXPECT_EQ(store.AttemptOutcomes().at(wire::OUTCOME_FAILED), 1);
      bool created = false;
      EXPECT_EQ(store.Submit(Job("key-3"), 150, &created).id, has_searches ? 7 : 5);
      EXPECT_TRUE(created);
    }
    int version = 0;
    const auto layout = Layout(old, &version);
    EXPECT_EQ(version, 4);
    for (const auto& [table, columns] : fresh_layout) EXPECT_EQ(layout.at(table), columns) << table;
    StateStore again(old, false);  // a second opening changes nothing
    EXPECT_EQ(again.Attempts(1).at(0).end_reason,
              "job rank 1 (pid 41 on h1) was killed by signal 9 (SIGKILL): out of memory");
  }
  EXPECT_GE(fixtures, 11);
}

// A version 3 database has no jobs.ended_at: an ended job's end is its newest event, or
// its submission, so that --keep-history can forget it; a trial stays with its search.
TEST_F(StateStoreTest, AVersionThreeDatabaseGetsTheEndsOfItsEndedJobs) {
  ExecOn(path_, ReadAll(SourcePath("tests/coordinator/data/schema_v3.sql")));
  StateStore store(path_, false);
  EXPECT_EQ(store.PruneHistory(110, 1000, 0, {1, 10}, 100), 1) << "job 4 ended at its submission, 100";
  EXPECT_FALSE(store.Find(4));
  EXPECT_TRUE(store.Find(1)) << "job 1 ended at its newest event, 115";
  EXPECT_EQ(store.PruneHistory(116, 1000, 0, {1, 10}, 100), 1);
  EXPECT_FALSE(store.Find(1));
  for (int64_t kept : {2, 3, 5, 6}) EXPECT_TRUE(store.Find(kept)) << kept;
}

// The figures a coordinator counts over a store's whole history (Note [History
// retention]): usage per user and in all, jobs by state and owner, attempts by outcome,
// and the submit-to-running seconds in the buckets of `bounds`, forgotten ones included.
struct HistoryFigures {
  std::vector<Usage> usage, total;
  std::map<std::pair<std::string, std::string>, int64_t> counts;
  std::map<wire::Outcome, int64_t> outcomes;
  std::map<double, int64_t> first_start_buckets;
  double first_start_sum = 0;
  int64_t first_starts = 0;
};

HistoryFigures FiguresOf(const StateStore& store, double now, const std::vector<double>& bounds) {
  HistoryFigures f;
  f.usage = store.UsageBy(true, now);
  f.total = store.UsageBy(false, now);
  f.counts = store.JobCountsByStateAndUser();
  f.outcomes = store.AttemptOutcomes();
  const FoldedHistogram folded = store.PrunedFirstStarts();
  f.first_start_buckets = folded.by_upper_bound;
  f.first_start_sum = folded.sum;
  f.first_starts = folded.count;
  for (double seconds : store.SecondsToFirstStart()) {
    const auto bound = std::lower_bound(bounds.begin(), bounds.end(), seconds);
    ++f.first_start_buckets[bound == bounds.end() ? std::numeric_limits<double>::infinity() : *bound];
    f.first_start_sum += seconds;
    ++f.first_starts;
  }
  return f;
}

void ExpectSameUsage(const std::vector<Usage>& before, const std::vector<Usage>& after) {
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    SCOPED_TRACE(before[i].user);
    EXPECT_EQ(after[i].user, before[i].user);
    EXPECT_EQ(after[i].jobs, before[i].jobs);
    EXPECT_EQ(after[i].attempts, before[i].attempts);
    EXPECT_NEAR(after[i].rank_seconds, before[i].rank_seconds, 1e-9 * before[i].rank_seconds);
    EXPECT_NEAR(after[i].gpu_seconds, before[i].gpu_seconds, 1e-9 * before[i].gpu_seconds + 1e-12);
  }
}

void ExpectSameFigures(const HistoryFigures& before, const HistoryFigures& after) {
  ExpectSameUsage(before.usage, after.usage);
  ExpectSameUsage(before.total, after.total);
  EXPECT_EQ(after.counts, before.counts);
  EXPECT_EQ(after.outcomes, before.outcomes);
  EXPECT_EQ(after.first_start_buckets, before.first_start_buckets);
  EXPECT_NEAR(after.first_start_sum, before.first_start_sum, 1e-9);
  EXPECT_EQ(after.first_starts, before.first_starts);
}

// A history of jobs on a store, each attempt's interval kept for the closed form of fair share.
class JobHistory {
 public:
  explicit JobHistory(StateStore* store) : store_(store) {}
  // A job of `user` submitted at `at` (of search `search`, or a search itself).
  int64_t Submit(const std::string& key, const std::string& user, double at, int64_t search = 0,
                 bool is_search = false) {
    NewJob job;
    job.name = "history";
    job.idempotency_key = key;
    job.spec_yaml = "name: history\n";
    job.source = "job.yaml";
    job.user = user;
    job.search = search;
    job.is_search = is_search;
    bool created = false;
    const int64_t id = store_->Submit(job, at, &created).id;
    store_->AddEvent(id, "submitted", at);
    return id;
  }
  // ... run once from `at + wait` for `seconds` on `ranks` ranks, ending in `state`, or
  // left running for kRunning.
  int64_t Run(const std::string& key, const std::string& user, double at, double wait, double seconds, int ranks,
              JobState state, int64_t search = 0) {
    const int64_t id = Submit(key, user, at, search);
    const int attempt = store_->StartAttempt(id, "w:0", at + wait);
    store_->StartUsage(id, attempt, at + wait, ranks, ranks / 2);
    const bool running = state == JobState::kRunning;
    intervals_.push_back(
        {user, ranks, at + wait, running ? std::numeric_limits<double>::infinity() : at + wait + seconds});
    if (running) return id;
    const wire::Outcome end = state == JobState::kSucceeded ? wire::OUTCOME_SUCCEEDED : wire::OUTCOME_FAILED;
    store_->EndAttempt(id, attempt, end, "", at + wait + seconds);
    store_->SetState(id, state, "", at + wait + seconds);
    return id;
  }
  // Each user's fair-share usage at `now` by the closed form, over every interval run.
  std::map<std::string, double> ClosedForm(double now, double half_life_s) const {
    std::map<std::string, double> out;
    for (const Interval& i : intervals_)
      out[i.user] += DecayedUsage::Of(i.ranks, i.from, std::min(i.to, now), now, half_life_s);
    return out;
  }

 private:
  struct Interval {
    std::string user;
    int ranks;
    double from, to;
  };
  StateStore* store_;
  std::vector<Interval> intervals_;
};

// Note [History retention]: forgetting old jobs keeps every figure the coordinator counts
// over its whole history (usage, fair share against the closed form, jobs by state,
// outcomes, the submit-to-running histogram), across a reopening too, and forgets only
// what ended before the cut: never a running or queued job, a trial without its search,
// or a search whose trial still runs.
TEST_F(StateStoreTest, ForgettingOldJobsKeepsEveryFigureCountedOverTheWholeHistory) {
  const double half_life = 3600, now = 50'000;
  const std::vector<double> bounds = {1, 10, 100};
  auto store = std::make_unique<StateStore>(path_, false);
  JobHistory history(store.get());
  const int64_t old_a = history.Run("a", "ana", 100, 0.5, 600, 4, JobState::kSucceeded);
  const int64_t old_b = history.Run("b", "bo", 200, 30, 1200, 2, JobState::kFailed);
  const int64_t old_c = history.Run("c", "ana", 300, 500, 60, 8, JobState::kSucceeded);
  const int64_t cancelled = history.Submit("d", "", 400);  // never ran
  store->SetState(cancelled, JobState::kCancelled, "cancelled while queued", 450);
  const int64_t search = history.Submit("s", "bo", 500, 0, true);
  const int64_t trial = history.Run("t1", "bo", 510, 5, 300, 2, JobState::kSucceeded, search);
  store->SetState(search, JobState::kSucceeded, "", 900);
  const int64_t live_search = history.Submit("s2", "", 600, 0, true);
  store->SetState(live_search, JobState::kCancelled, "", 700);
  const int64_t live_trial = history.Run("t2", "", 610, 2, 0, 2, JobState::kRunning, live_search);
  const int64_t recent = history.Run("r", "ana", 40'000, 3, 100, 4, JobState::kSucceeded);
  const int64_t running = history.Run("u", "bo", 45'000, 12, 0, 6, JobState::kRunning);
  const int64_t queued = history.Submit("q", "", 46'000);
  store->KeepQuorumId(old_a, 7);  // an elastic job's ids go with it (Note [Step quorum])
  store->KeepQuorumId(recent, 3);
  const HistoryFigures before = FiguresOf(*store, now, bounds);
  store->DecayedRankSeconds(now, half_life);  // the running totals, loaded before the prune

  int64_t forgotten = 0;
  // Batches of one: the cancelled search whose trial runs on ended first of all (700),
  // and must not stop the jobs behind it from going.
  for (int64_t batch; (batch = store->PruneHistory(10'000, now, half_life, bounds, 1)) > 0;) forgotten += batch;
  EXPECT_EQ(forgotten, 6) << "a, b, c, the cancelled one, the search and its trial";
  for (int64_t gone : {old_a, old_b, old_c, cancelled, search, trial}) EXPECT_FALSE(store->Find(gone)) << gone;
  for (int64_t kept : {live_search, live_trial, recent, running, queued}) EXPECT_TRUE(store->Find(kept)) << kept;
  EXPECT_TRUE(store->Trials(search).empty());
  EXPECT_FALSE(store->FindSearch(search));
  EXPECT_EQ(store->LastQuorumId(old_a), 0u);
  EXPECT_EQ(store->LastQuorumId(recent), 3u);

  const double later = now + 3600;  // fair share an hour on, against the closed form
  const std::map<std::string, double> closed = history.ClosedForm(later, half_life);
  for (const bool reopen : {false, true}) {
    SCOPED_TRACE(reopen ? "reopened" : "the store that forgot");
    if (reopen) {
      store.reset();
      store = std::make_unique<StateStore>(path_, false);
    }
    ExpectSameFigures(before, FiguresOf(*store, now, bounds));
    const auto decayed = store->DecayedRankSeconds(later, half_life);
    EXPECT_EQ(decayed.size(), closed.size());
    for (const auto& [user, value] : closed) EXPECT_NEAR(decayed.at(user), value, 1e-9 * value + 1e-9) << user;
  }
  bool created = false;
  EXPECT_EQ(store->Submit(Job("z"), now, &created).id, queued + 1) << "ids are never reused";
}

TEST_F(StateStoreTest, ADatabaseOfANewerSchemaIsRefused) {
  { StateStore store(path_, false); }
  ExecOn(path_, "PRAGMA user_version = 9;");
  try {
    StateStore store(path_, false);
    FAIL() << "a database of schema version 9 was opened";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("written by a newer coordinator (schema version 9; this one knows up to 4)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(StateStoreTest, CorruptDatabaseIsRefusedUnlessStartingFresh) {
  std::ofstream(path_) << std::string(8192, 'x');
  try {
    StateStore store(path_, false);
    FAIL() << "a corrupt database was accepted";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
  }
  StateStore fresh(path_, true);
  EXPECT_TRUE(fresh.Jobs().empty());
  EXPECT_TRUE(fs::exists(path_ + ".corrupt"));
}

// A state file emptied to 0 bytes is not an empty queue: refused, unless --fresh.
TEST_F(StateStoreTest, ZeroByteStateFileIsRefusedUnlessStartingFresh) {
  std::ofstream(path_).close();
  try {
    StateStore store(path_, false);
    FAIL() << "a 0-byte state file was accepted";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("an empty file (0 bytes)"), std::string::npos) << e.what();
  }
  StateStore fresh(path_, true);
  EXPECT_TRUE(fresh.Jobs().empty());
}

// Two coordinators on one state file: the second is refused, naming the first's pid, and
// the file is free again once the first is gone.
TEST_F(StateStoreTest, ASecondStoreOnTheSameFileIsRefused) {
  {
    StateStore first(path_, false);
    try {
      StateStore second(path_, false);
      FAIL() << "two stores opened one state file";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("another coordinator (pid " + std::to_string(::getpid()) + ")"),
                std::string::npos)
          << e.what();
    }
    bool created = false;
    first.Submit(Job("still mine"), 1.0, &created);
    EXPECT_TRUE(created);
  }
  StateStore again(path_, false);
  EXPECT_EQ(again.Jobs().size(), 1u);
}

}  // namespace
}  // namespace trainyard
