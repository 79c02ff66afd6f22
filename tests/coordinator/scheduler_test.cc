#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace trainyard {
namespace {

std::vector<WorkerRank> World(const std::string& name, int size, const std::string& device = "cpu") {
  std::vector<WorkerRank> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back({name, r, device, "", 0});
  return ranks;
}

QueuedJob Job(const std::string& id, int ranks, int64_t order, int priority = 0, double estimate = 0,
              const std::string& device = "any") {
  return {id, priority, order, ranks, device, estimate};
}

std::vector<std::string> Started(const ScheduleResult& r) {
  std::vector<std::string> ids;
  for (const auto& p : r.start) ids.push_back(p.job);
  return ids;
}

TEST(Scheduler, PriorityFirstThenSubmissionOrder) {
  Scheduler s;
  auto ranks = World("w", 1);
  EXPECT_EQ(Started(s.Schedule({Job("low", 1, 1), Job("high", 1, 2, 5)}, ranks, 0)), std::vector<std::string>{"high"});
  EXPECT_EQ(Started(s.Schedule({Job("second", 1, 2), Job("first", 1, 1)}, ranks, 0)),
            std::vector<std::string>{"first"});
}

TEST(Scheduler, GangPlacementTwoOfThreeTwoRankJobsOnFourRanks) {
  Scheduler s;
  ScheduleResult r = s.Schedule({Job("a", 2, 1), Job("b", 2, 2), Job("c", 2, 3)}, World("w", 4), 0);
  ASSERT_EQ(Started(r), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.start[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.start[1].ranks, (std::vector<int>{2, 3}));
  ASSERT_TRUE(r.reservation.has_value());
  EXPECT_EQ(r.reservation->job, "c");
}

TEST(Scheduler, AGangNeverSpansTwoWorlds) {
  Scheduler s;
  auto ranks = World("w1", 2);
  for (auto& r : World("w2", 2)) ranks.push_back(r);
  ranks[0].job = "busy", ranks[2].job = "busy2";
  ScheduleResult r = s.Schedule({Job("pair", 2, 1)}, ranks, 0);
  EXPECT_TRUE(r.start.empty());
}

TEST(Scheduler, DeviceKindMustMatch) {
  Scheduler s;
  auto ranks = World("cpus", 2);
  for (auto& r : World("gpus", 1, "cuda")) ranks.push_back(r);
  ScheduleResult r = s.Schedule({Job("g", 1, 1, 0, 0, "cuda"), Job("c", 2, 2, 0, 0, "cpu")}, ranks, 0);
  ASSERT_EQ(r.start.size(), 2u);
  EXPECT_EQ(r.start[0].world, "gpus");
  EXPECT_EQ(r.start[1].world, "cpus");
}

TEST(Scheduler, JobLargerThanAnyWorldIsReportedNotReserved) {
  Scheduler s;
  ScheduleResult r = s.Schedule({Job("huge", 8, 1), Job("small", 1, 2)}, World("w", 4), 0);
  EXPECT_EQ(r.unplaceable, std::vector<std::string>{"huge"});
  EXPECT_EQ(Started(r), std::vector<std::string>{"small"});
}

// World of 4: ranks 0-1 run a job estimated to end at t=100. The head wants all 4, so
// it is reserved for t=100; ranks 2-3 are free until then.
class Backfill : public ::testing::Test {
 protected:
  std::vector<WorkerRank> ranks_ = [] {
    auto r = World("w", 4);
    r[0].job = r[1].job = "running";
    r[0].estimated_end = r[1].estimated_end = 100;
    return r;
  }();
  Scheduler s_;
};

TEST_F(Backfill, ShortJobThatEndsBeforeTheReservationStarts) {
  ScheduleResult r = s_.Schedule({Job("head", 4, 1), Job("short", 2, 2, 0, 50)}, ranks_, 0);
  ASSERT_TRUE(r.reservation.has_value());
  EXPECT_EQ(r.reservation->job, "head");
  EXPECT_DOUBLE_EQ(r.reservation->start, 100);
  ASSERT_EQ(Started(r), std::vector<std::string>{"short"});
  EXPECT_TRUE(r.start[0].backfilled);
}

TEST_F(Backfill, LongOrUnestimatedJobsWaitSoTheHeadIsNotStarved) {
  EXPECT_TRUE(s_.Schedule({Job("head", 4, 1), Job("long", 2, 2, 0, 500)}, ranks_, 0).start.empty());
  EXPECT_TRUE(s_.Schedule({Job("head", 4, 1), Job("unknown", 2, 2)}, ranks_, 0).start.empty());
}

TEST_F(Backfill, JobThatLeavesTheHeadEnoughRanksMayRunLong) {
  // The head needs only 2 of the 4 ranks at t=100; a 1-rank job may take rank 2 for as
  // long as it likes, since ranks 0, 1 (freed at 100) and 3 remain.
  ScheduleResult r = s_.Schedule({Job("head", 3, 1), Job("tiny", 1, 2)}, ranks_, 0);
  ASSERT_EQ(Started(r), std::vector<std::string>{"tiny"});
}

}  // namespace
}  // namespace trainyard
