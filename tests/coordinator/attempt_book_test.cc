// The coordinator's book of running attempts: which attempt each slot belongs to, and
// the one way an attempt ends (with a real store in a temporary folder).
#include "coordinator/attempt_book.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace trainyard {
namespace {

RunningAttempt Attempt(int64_t job, int number, std::vector<RankKey> slots) {
  RunningAttempt a;
  a.job = job;
  a.attempt = number;
  a.slots = std::move(slots);
  return a;
}

TEST(AttemptBookTest, ASlotAwaitsTheAttemptItBelongsToUntilItsResultArrives) {
  AttemptBook book;
  book.Add(Attempt(7, 1, {{"a", 0}, {"b", 0}}));
  book.Add(Attempt(9, 2, {{"c", 0}}));
  ASSERT_NE(book.Awaiting({"b", 0}), nullptr);
  EXPECT_EQ(book.Awaiting({"b", 0})->job, 7);
  EXPECT_EQ(book.Awaiting({"c", 0})->job, 9);
  EXPECT_EQ(book.Awaiting({"d", 0}), nullptr);
  book.Find(7)->finished.insert({"b", 0});
  EXPECT_EQ(book.Awaiting({"b", 0}), nullptr) << "its result came: the slot is free";
  const auto by_slot = book.AwaitingBySlot();
  EXPECT_EQ(by_slot.size(), 2u);
  EXPECT_EQ(by_slot.at({"a", 0})->job, 7);
  EXPECT_EQ(by_slot.at({"c", 0})->job, 9);
  EXPECT_EQ(by_slot.count({"b", 0}), 0u);
}

TEST(AttemptBookTest, AnEndedOrOtherAttemptNumberIsNotFound) {
  AttemptBook book;
  book.Add(Attempt(7, 1, {{"a", 0}}));
  EXPECT_NE(book.Find(7, 1), nullptr);
  EXPECT_EQ(book.Find(7, 2), nullptr) << "a message about another attempt of the job";
  book.Add(Attempt(7, 2, {{"b", 0}}));  // the next attempt replaces it
  EXPECT_EQ(book.size(), 1u);
  EXPECT_EQ(book.Find(7, 1), nullptr);
  const std::optional<RunningAttempt> removed = book.Remove(7);
  ASSERT_TRUE(removed);
  EXPECT_EQ(removed->attempt, 2);
  EXPECT_EQ(book.Find(7), nullptr);
  EXPECT_FALSE(book.Remove(7));
}

TEST(ReplacementTest, AnElasticAttemptShortOfReplicasTakesOneUnlessItIsStoppingOrDone) {
  RunningAttempt a = Attempt(7, 1, {{"a", 0}, {"b", 0}, {"c", 0}});
  a.elastic = true;
  a.max_replicas = 3;
  EXPECT_EQ(LiveReplicas(a), 3);
  EXPECT_FALSE(TakesReplacements(a)) << "at full strength";
  a.finished.insert({"c", 0});
  EXPECT_EQ(LiveReplicas(a), 2);
  EXPECT_TRUE(TakesReplacements(a));
  for (auto stopping :
       {+[](RunningAttempt& r) { r.preempted_by = 9; }, +[](RunningAttempt& r) { r.search_stop_at = 2; },
        +[](RunningAttempt& r) { r.replica_succeeded = true; }, +[](RunningAttempt& r) { r.replica_bad_input = true; },
        +[](RunningAttempt& r) { r.adopted = false; }, +[](RunningAttempt& r) { r.elastic = false; }}) {
    RunningAttempt b = a;
    stopping(b);
    EXPECT_FALSE(TakesReplacements(b));
  }
  a.finished.insert({"a", 0});
  a.finished.insert({"b", 0});
  EXPECT_FALSE(TakesReplacements(a)) << "no live replica: the attempt ends instead";
}

TEST(ReplacementTest, ThePlaceOfFailedReplicasWaitsLongerEachTimeUpToAMinute) {
  EXPECT_EQ(ReplacementBackoffS(0), 0);
  EXPECT_EQ(ReplacementBackoffS(1), 1);
  EXPECT_EQ(ReplacementBackoffS(2), 2);
  EXPECT_EQ(ReplacementBackoffS(4), 8);
  EXPECT_EQ(ReplacementBackoffS(7), 60);
  EXPECT_EQ(ReplacementBackoffS(1000), 60);
}

TEST(AttemptBookTest, AStallRestartsEveryAttemptsStartGrace) {
  AttemptBook book;
  book.Add(Attempt(1, 1, {{"a", 0}})).started_listening = 3;
  book.Add(Attempt(2, 1, {{"b", 0}})).started_listening = 8;
  book.RestartGraces(42);
  for (const auto& [job, attempt] : book.all()) EXPECT_EQ(attempt.started_listening, 42) << job;
}

class AttemptBookEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ty_book_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    store_ = std::make_unique<StateStore>((dir_ / "state.db").string(), false);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  int64_t Submit(const std::string& key) {
    NewJob job;
    job.name = "langid";
    job.idempotency_key = key;
    job.spec_yaml = "name: langid\n";
    job.source = "job.yaml";
    job.ranks = 1;
    bool created = false;
    return store_->Submit(job, 1.0, &created).id;
  }
  bool HasEvent(int64_t job, const std::string& event) const {
    const std::vector<std::string> events = store_->Events(job);
    return std::find(events.begin(), events.end(), event) != events.end();
  }

  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
};

// An attempt's end is in the store (its outcome, the job requeued with its backoff, the
// event) when End returns it, and it is no longer in the book.
TEST_F(AttemptBookEndTest, EndRecordsTheOutcomeAndTheJobsStateThenTakesTheAttemptOut) {
  AttemptBook book;
  const int64_t id = Submit("a");
  const int number = store_->StartAttempt(id, "w:0", 2.0);
  book.Add(Attempt(id, number, {{"w", 0}}));
  const AttemptEnding ending{wire::OUTCOME_FAILED,
                             "w:0 stopped heartbeating",
                             JobState::kQueued,
                             "attempt 1 failed",
                             50.0,
                             "attempt 1 failed: w:0 stopped heartbeating; requeued",
                             "attempt ended"};
  const std::optional<RunningAttempt> ended = book.End(*store_, id, ending, 10.0);
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->attempt, number);
  EXPECT_EQ(book.Find(id), nullptr);
  const std::vector<AttemptRecord> attempts = store_->Attempts(id);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].end, wire::OUTCOME_FAILED);
  EXPECT_EQ(attempts[0].end_reason, "w:0 stopped heartbeating");
  EXPECT_EQ(attempts[0].ended_at, 10.0);
  const JobRecord job = *store_->Find(id);
  EXPECT_EQ(job.state, JobState::kQueued);
  EXPECT_EQ(job.not_before, 50.0);
  EXPECT_TRUE(HasEvent(id, ending.event));
}

// A queued job (a cancel before it started) has no attempt to end: only its state and
// event change, and the book's other attempts stay.
TEST_F(AttemptBookEndTest, AJobWithNoRunningAttemptOnlyChangesState) {
  AttemptBook book;
  const int64_t queued = Submit("q"), running = Submit("r");
  book.Add(Attempt(running, store_->StartAttempt(running, "w:0", 2.0), {{"w", 0}}));
  const AttemptEnding cancel{wire::OUTCOME_CANCELLED, "", JobState::kCancelled, "cancelled by admin", 0,
                             "cancelled by admin",    ""};
  EXPECT_FALSE(book.End(*store_, queued, cancel, 5.0));
  EXPECT_EQ(store_->Find(queued)->state, JobState::kCancelled);
  EXPECT_TRUE(store_->Attempts(queued).empty());
  EXPECT_TRUE(HasEvent(queued, "cancelled by admin"));
  EXPECT_NE(book.Find(running), nullptr);
  EXPECT_EQ(store_->Attempts(running)[0].end, wire::OUTCOME_UNSPECIFIED);
}

}  // namespace
}  // namespace trainyard
