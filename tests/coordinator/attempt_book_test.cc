// The coordinator's book of running attempts: which attempt each slot belongs to.
#include "coordinator/attempt_book.h"

#include <gtest/gtest.h>

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

TEST(AttemptBookTest, AStallRestartsEveryAttemptsStartGrace) {
  AttemptBook book;
  book.Add(Attempt(1, 1, {{"a", 0}})).started_listening = 3;
  book.Add(Attempt(2, 1, {{"b", 0}})).started_listening = 8;
  book.RestartGraces(42);
  for (const auto& [job, attempt] : book.all()) EXPECT_EQ(attempt.started_listening, 42) << job;
}

}  // namespace
}  // namespace trainyard
