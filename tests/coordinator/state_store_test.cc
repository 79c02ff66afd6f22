// The state store on a real SQLite file.
#include "coordinator/state_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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
      store.EndAttempt(id, attempt, "failed: boom", 3.0);
      store.AddEvent(id, "attempt 1 failed", 3.0);
      throw std::runtime_error("killed between the writes");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(store.Find(id)->state, JobState::kQueued);
    EXPECT_EQ(store.Find(id)->attempts, 0);
    EXPECT_TRUE(store.Attempts(id).empty());
    EXPECT_TRUE(store.Events(id).empty());
    StateStore::Transaction transaction(store);
    store.EndAttempt(id, store.StartAttempt(id, "w:0,1", 2.0), "succeeded", 4.0);
    store.SetState(id, JobState::kSucceeded, "");
    transaction.Commit();
  }
  StateStore reopened(path_, false);
  EXPECT_EQ(reopened.Find(id)->state, JobState::kSucceeded);
  ASSERT_EQ(reopened.Attempts(id).size(), 1u);
  EXPECT_EQ(reopened.Attempts(id)[0].outcome, "succeeded");
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
  store.EndAttempt(1, 1, "succeeded", 3.0);
  auto open = store.OpenAttempts();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].job, 2);
  EXPECT_EQ(open[0].placement, "w:2,3");
  EXPECT_EQ(store.Attempts(1).at(0).outcome, "succeeded");
}

TEST_F(StateStoreTest, RequeueAndFailureKeepTheReason) {
  StateStore store(path_, false);
  bool created = false;
  store.Submit(Job("k"), 1.0, &created);
  store.StartAttempt(1, "w:0,1", 2.0);
  store.EndAttempt(1, 1, "rank 1 killed by signal 9", 3.0);
  store.Requeue(1, "attempt 1: rank 1 killed by signal 9", 13.0);
  store.AddEvent(1, "requeued", 3.0);
  auto job = *store.Find(1);
  EXPECT_EQ(job.state, JobState::kQueued);
  EXPECT_DOUBLE_EQ(job.not_before, 13.0);
  EXPECT_EQ(job.reason, "attempt 1: rank 1 killed by signal 9");
  EXPECT_EQ(store.Events(1), std::vector<std::string>{"requeued"});
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
