#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace trainyard {
namespace {

// `count` single-slot agents on `host`, named <host>-<i>.
std::vector<WorkerRank> Agents(const std::string& host, int count, const std::string& device = "cpu") {
  std::vector<WorkerRank> slots;
  for (int i = 0; i < count; ++i) slots.push_back({host + "-" + std::to_string(i), 0, host, device, "", 0});
  return slots;
}

std::vector<WorkerRank> Join(std::vector<WorkerRank> a, const std::vector<WorkerRank>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
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

std::vector<std::string> Worlds(const Placement& p) {
  std::vector<std::string> worlds;
  for (const SlotRef& s : p.slots) worlds.push_back(s.world);
  return worlds;
}

TEST(Scheduler, PriorityFirstThenSubmissionOrder) {
  Scheduler s;
  auto slots = Agents("h", 1);
  EXPECT_EQ(Started(s.Schedule({Job("low", 1, 1), Job("high", 1, 2, 5)}, slots, 0)), std::vector<std::string>{"high"});
  EXPECT_EQ(Started(s.Schedule({Job("second", 1, 2), Job("first", 1, 1)}, slots, 0)),
            std::vector<std::string>{"first"});
}

TEST(Scheduler, GangPlacementTwoOfThreeTwoRankJobsOnFourSlots) {
  Scheduler s;
  ScheduleResult r = s.Schedule({Job("a", 2, 1), Job("b", 2, 2), Job("c", 2, 3)}, Agents("h", 4), 0);
  ASSERT_EQ(Started(r), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Worlds(r.start[0]), (std::vector<std::string>{"h-0", "h-1"}));
  EXPECT_EQ(Worlds(r.start[1]), (std::vector<std::string>{"h-2", "h-3"}));
  ASSERT_TRUE(r.reservation.has_value());
  EXPECT_EQ(r.reservation->job, "c");
}

// Any free slots form a job, whatever agents or hosts they are on; the fewest hosts
// that can hold it are used, the fullest first.
TEST(Scheduler, AGangSpansAgentsAndHostsUsingAsFewHostsAsItCan) {
  Scheduler s;
  auto slots = Join(Join(Agents("a", 2), Agents("b", 3)), Agents("c", 1));
  slots[0].job = "busy";  // a keeps one free slot
  ScheduleResult r = s.Schedule({Job("three", 3, 1)}, slots, 0);
  ASSERT_EQ(Started(r), std::vector<std::string>{"three"});
  EXPECT_EQ(Worlds(r.start[0]), (std::vector<std::string>{"b-0", "b-1", "b-2"}));
  r = s.Schedule({Job("five", 5, 1)}, slots, 0);
  ASSERT_EQ(Started(r), std::vector<std::string>{"five"});
  EXPECT_EQ(Worlds(r.start[0]), (std::vector<std::string>{"b-0", "b-1", "b-2", "a-1", "c-0"}));
  slots[1].job = "busy2";
  EXPECT_TRUE(s.Schedule({Job("five", 5, 1)}, slots, 0).start.empty());  // four free slots
}

TEST(Scheduler, DeviceKindMustMatchAndAGangNeverMixesKinds) {
  Scheduler s;
  auto slots = Join(Agents("cpus", 2), Agents("gpus", 1, "cuda"));
  ScheduleResult r = s.Schedule({Job("g", 1, 1, 0, 0, "cuda"), Job("c", 2, 2, 0, 0, "cpu")}, slots, 0);
  ASSERT_EQ(r.start.size(), 2u);
  EXPECT_EQ(Worlds(r.start[0]), std::vector<std::string>{"gpus-0"});
  EXPECT_EQ(Worlds(r.start[1]), (std::vector<std::string>{"cpus-0", "cpus-1"}));
  // Three free slots, but of two kinds: a 3-rank job of any kind cannot start.
  r = s.Schedule({Job("mixed", 3, 1)}, slots, 0);
  EXPECT_EQ(r.unplaceable, std::vector<std::string>{"mixed"});
}

TEST(Scheduler, JobLargerThanThePoolIsReportedNotReserved) {
  Scheduler s;
  ScheduleResult r = s.Schedule({Job("huge", 8, 1), Job("small", 1, 2)}, Agents("h", 4), 0);
  EXPECT_EQ(r.unplaceable, std::vector<std::string>{"huge"});
  EXPECT_EQ(Started(r), std::vector<std::string>{"small"});
}

// Four slots: two run a job estimated to end at t=100. The head wants all 4, so it is
// reserved for t=100; the other two are free until then.
class Backfill : public ::testing::Test {
 protected:
  std::vector<WorkerRank> slots_ = [] {
    auto r = Agents("h", 4);
    r[0].job = r[1].job = "running";
    r[0].estimated_end = r[1].estimated_end = 100;
    return r;
  }();
  Scheduler s_;
};

TEST_F(Backfill, ShortJobThatEndsBeforeTheReservationStarts) {
  ScheduleResult r = s_.Schedule({Job("head", 4, 1), Job("short", 2, 2, 0, 50)}, slots_, 0);
  ASSERT_TRUE(r.reservation.has_value());
  EXPECT_EQ(r.reservation->job, "head");
  EXPECT_DOUBLE_EQ(r.reservation->start, 100);
  ASSERT_EQ(Started(r), std::vector<std::string>{"short"});
  EXPECT_TRUE(r.start[0].backfilled);
}

TEST_F(Backfill, LongOrUnestimatedJobsWaitSoTheHeadIsNotStarved) {
  EXPECT_TRUE(s_.Schedule({Job("head", 4, 1), Job("long", 2, 2, 0, 500)}, slots_, 0).start.empty());
  EXPECT_TRUE(s_.Schedule({Job("head", 4, 1), Job("unknown", 2, 2)}, slots_, 0).start.empty());
}

TEST_F(Backfill, JobThatLeavesTheHeadEnoughSlotsMayRunLong) {
  // The head needs 3 of the 4 slots at t=100; a 1-slot job may take one for as long as
  // it likes, since the two freed at 100 and the fourth remain.
  ScheduleResult r = s_.Schedule({Job("head", 3, 1), Job("tiny", 1, 2)}, slots_, 0);
  ASSERT_EQ(Started(r), std::vector<std::string>{"tiny"});
}

TEST_F(Backfill, AJobOfAnotherDeviceKindNeverDelaysTheHead) {
  auto slots = Join(slots_, Agents("g", 1, "cuda"));
  ScheduleResult r = s_.Schedule({Job("head", 4, 1, 0, 0, "cpu"), Job("gpu", 1, 2, 0, 0, "cuda")}, slots, 0);
  ASSERT_EQ(Started(r), std::vector<std::string>{"gpu"});
}

}  // namespace
}  // namespace trainyard
