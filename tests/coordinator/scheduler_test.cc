#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace trainyard {
namespace {

// `count` single-slot agents on `host`, named <host>-<i>.
std::vector<WorkerRank> Agents(const std::string& host, int count, const std::string& device = "cpu") {
  std::vector<WorkerRank> slots;
  slots.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) slots.push_back({host + "-" + std::to_string(i), 0, host, device, "", 0});
  return slots;
}

std::vector<WorkerRank> Join(std::vector<WorkerRank> a, const std::vector<WorkerRank>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

QueuedJob Job(const std::string& id, int ranks, int64_t order, int priority = 0, double estimate = 0,
              const std::string& device = "any") {
  return {id, priority, order, ranks, device, estimate, "", 0};
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

QueuedJob Owned(const std::string& id, int ranks, int64_t order, const std::string& user, double usage,
                int priority = 0) {
  QueuedJob job = Job(id, ranks, order, priority);
  job.user = user;
  job.usage = usage;
  return job;
}

// Four slots, each pair running a job: "low" (priority 0) and "mid" (priority 5).
class Preemption : public ::testing::Test {
 protected:
  std::vector<WorkerRank> slots_ = [] {
    auto r = Agents("h", 4);
    r[0].job = r[1].job = "low";
    r[2].job = r[3].job = "mid";
    return r;
  }();
  std::vector<RunningJob> running_ = {{"low", 0, "a", true, false, 1}, {"mid", 5, "b", true, false, 2}};
  SchedulerPolicy on_{true, 0};
  Scheduler s_;
};

TEST_F(Preemption, OffByDefault) {
  ScheduleResult r = s_.Schedule({Job("urgent", 2, 9, 10)}, slots_, 0, running_);
  EXPECT_TRUE(r.preempt.empty());
  EXPECT_EQ(r.waiting.at("urgent").rfind("Resources:", 0), 0u) << r.waiting.at("urgent");
}

TEST_F(Preemption, TheFewestJobsOfLowerPriorityTheLowestFirst) {
  ScheduleResult r = s_.Schedule({Job("urgent", 2, 9, 10)}, slots_, 0, running_, on_);
  EXPECT_EQ(r.preempt, std::vector<std::string>{"low"});
  EXPECT_TRUE(r.start.empty());  // it starts once the victim's slots are free
  EXPECT_EQ(r.waiting.at("urgent"), "Preempting: stopping job low (lower priority) to make room");
  // Four ranks take both.
  r = s_.Schedule({Job("all", 4, 9, 10)}, slots_, 0, running_, on_);
  EXPECT_EQ(r.preempt, (std::vector<std::string>{"low", "mid"}));
}

// The free slot the head counts on, beside its victim's, is not backfilled meanwhile.
TEST_F(Preemption, NoBackfillIntoTheSlotsTheHeadWaitsFor) {
  auto slots = Agents("h", 3);
  slots[0].job = slots[1].job = "low";
  ScheduleResult r = s_.Schedule({Job("urgent", 3, 9, 10), Job("small", 1, 10, 0, 1)}, slots, 0, running_, on_);
  EXPECT_EQ(r.preempt, std::vector<std::string>{"low"});
  EXPECT_TRUE(r.start.empty());
  EXPECT_EQ(r.waiting.at("small").rfind("Priority: behind job urgent", 0), 0u) << r.waiting.at("small");
}

TEST_F(Preemption, OneLargeVictimRatherThanTwoSmallOnes) {
  auto slots = Agents("h", 6);
  slots[0].job = slots[1].job = slots[2].job = slots[3].job = "big";
  slots[4].job = "s1";
  slots[5].job = "s2";
  std::vector<RunningJob> running = {
      {"big", 3, "a", true, false, 1}, {"s1", 0, "a", true, false, 2}, {"s2", 0, "a", true, false, 3}};
  ScheduleResult r = s_.Schedule({Job("urgent", 2, 9, 10)}, slots, 0, running, on_);
  EXPECT_EQ(r.preempt, std::vector<std::string>{"big"});
  // Equal sizes: the lower priority, then the most recently started.
  running[0].priority = 0;
  slots[0].job = slots[1].job = "big";
  slots[2].job = slots[3].job = "";
  r = s_.Schedule({Job("urgent", 4, 9, 10)}, slots, 0, running, on_);
  EXPECT_EQ(r.preempt, (std::vector<std::string>{"big"}));
  r = s_.Schedule({Job("urgent", 3, 9, 10)}, slots, 0, running, on_);
  EXPECT_EQ(r.preempt, std::vector<std::string>{"s2"});
}

TEST_F(Preemption, NeverEqualOrHigherPriorityNorJobsThatOptedOut) {
  EXPECT_TRUE(s_.Schedule({Job("peer", 2, 9, 5)}, slots_, 0, running_, on_).preempt.empty() == false);
  // Priority 5 may stop "low" (0) but never "mid" (5): a 4-rank job at 5 preempts nothing.
  EXPECT_TRUE(s_.Schedule({Job("peer", 4, 9, 5)}, slots_, 0, running_, on_).preempt.empty());
  EXPECT_TRUE(s_.Schedule({Job("equal", 2, 9, 0)}, slots_, 0, running_, on_).preempt.empty());
  running_[0].preemptible = false;
  EXPECT_EQ(s_.Schedule({Job("urgent", 2, 9, 10)}, slots_, 0, running_, on_).preempt, std::vector<std::string>{"mid"});
}

// A head that preemption cannot help says which lower-priority jobs hold the pool
// because they opted out of preemption; a holder of equal priority is not named.
TEST_F(Preemption, AHeadBlockedByJobsThatOptedOutNamesThem) {
  running_[0].preemptible = false;
  running_[1].preemptible = false;
  ScheduleResult r = s_.Schedule({Job("urgent", 2, 9, 10)}, slots_, 0, running_, on_);
  EXPECT_TRUE(r.preempt.empty());
  const std::string& why = r.waiting.at("urgent");
  EXPECT_EQ(why.rfind("Resources: needs 2 slots, 0 free; first in line", 0), 0u) << why;
  EXPECT_NE(why.find("; not preemptible: job low (2 slots, priority 0), job mid (2 slots, priority 5)"),
            std::string::npos)
      << why;
  r = s_.Schedule({Job("peer", 2, 9, 5)}, slots_, 0, running_, on_);
  EXPECT_NE(r.waiting.at("peer").find("not preemptible: job low (2 slots, priority 0)"), std::string::npos)
      << r.waiting.at("peer");
  EXPECT_EQ(r.waiting.at("peer").find("job mid"), std::string::npos) << r.waiting.at("peer");
}

// Two jobs of equal priority never take turns stopping each other, however fair share
// orders them; and while a victim stops, nothing more is stopped.
TEST_F(Preemption, NoPingPongAndNoSecondVictimWhileTheFirstStops) {
  std::vector<RunningJob> equal = {{"low", 5, "a", true, false, 1}, {"mid", 5, "b", true, false, 2}};
  EXPECT_TRUE(s_.Schedule({Owned("b2", 2, 9, "c", 0, 5)}, slots_, 0, equal, on_).preempt.empty());
  running_[0].stopping = true;
  ScheduleResult r = s_.Schedule({Job("urgent", 2, 9, 10)}, slots_, 0, running_, on_);
  EXPECT_TRUE(r.preempt.empty());
  EXPECT_EQ(r.waiting.at("urgent").rfind("Preempting: waiting", 0), 0u) << r.waiting.at("urgent");
}

// A wave of urgent jobs makes room in one pass: each job behind the head that fits nowhere
// stops its own victims, never one an earlier job stops, and never with the free slots
// the head counts on.
TEST_F(Preemption, AWaveOfUrgentJobsPreemptsInOnePass) {
  ScheduleResult r =
      s_.Schedule({Job("u1", 2, 9, 10), Job("u2", 2, 10, 10), Job("u3", 2, 11, 10)}, slots_, 0, running_, on_);
  EXPECT_EQ(r.preempt, (std::vector<std::string>{"low", "mid"}));
  EXPECT_EQ(r.preempt_for, (std::vector<std::string>{"u1", "u2"}));
  EXPECT_EQ(r.waiting.at("u2"), "Preempting: stopping job mid (lower priority) to make room");
  EXPECT_EQ(r.waiting.at("u3").rfind("Resources: needs 2 slots; behind job u1", 0), 0u) << r.waiting.at("u3");
  // The next pass: each counts the job stopping for it, and stops nothing more.
  running_[0].stopping = running_[1].stopping = true;
  running_[0].stopping_for = "u1";
  running_[1].stopping_for = "u2";
  r = s_.Schedule({Job("u1", 2, 9, 10), Job("u2", 2, 10, 10), Job("u3", 2, 11, 10)}, slots_, 0, running_, on_);
  EXPECT_TRUE(r.preempt.empty());
  EXPECT_EQ(r.waiting.at("u1").rfind("Preempting: waiting", 0), 0u) << r.waiting.at("u1");
  EXPECT_EQ(r.waiting.at("u2").rfind("Preempting: waiting", 0), 0u) << r.waiting.at("u2");
  // u1 started elsewhere meanwhile: the job stopping for it is anyone's, the first to ask.
  r = s_.Schedule({Job("u2", 2, 10, 10), Job("u3", 2, 11, 10)}, slots_, 0, running_, on_);
  EXPECT_TRUE(r.preempt.empty());
  EXPECT_EQ(r.waiting.at("u2").rfind("Preempting: waiting", 0), 0u) << r.waiting.at("u2");
  EXPECT_EQ(r.waiting.at("u3").rfind("Preempting: waiting", 0), 0u) << r.waiting.at("u3");
}

// The free slot the head counts on is the head's: a job behind it stops a whole job's
// worth of its own rather than share it, and a job that fits now, or of no higher
// priority than any running job, stops nothing.
TEST_F(Preemption, AJobBehindTheHeadNeverCountsTheHeadsFreeSlots) {
  auto slots = Join(Agents("h", 4), Agents("g", 1));
  slots[0].job = slots[1].job = "low";
  slots[2].job = slots[3].job = "mid";
  ScheduleResult r =
      s_.Schedule({Job("u1", 3, 9, 10), Job("u2", 1, 10, 10), Job("u3", 2, 11, 10)}, slots, 0, running_, on_);
  EXPECT_EQ(r.preempt, (std::vector<std::string>{"low", "mid"}));  // u1: the free slot and low's two
  EXPECT_EQ(r.preempt_for, (std::vector<std::string>{"u1", "u3"}));
  EXPECT_EQ(r.waiting.at("u2").rfind("Reservation: it fits now", 0), 0u) << r.waiting.at("u2");
  EXPECT_EQ(r.waiting.at("u3"), "Preempting: stopping job mid (lower priority) to make room");
  r = s_.Schedule({Job("u1", 3, 9, 10), Job("peer", 2, 10, 0)}, slots, 0, running_, on_);
  EXPECT_EQ(r.preempt, (std::vector<std::string>{"low"}));
}

// However long the queue, at most kMaxPreemptingPerPass jobs behind the head try.
TEST_F(Preemption, AtMostSoManyJobsBehindTheHeadTryInOnePass) {
  std::vector<WorkerRank> slots;
  std::vector<RunningJob> running;
  std::vector<QueuedJob> queue;
  for (int i = 0; i < kMaxPreemptingPerPass + 8; ++i) {
    const std::string id = "low" + std::to_string(i);
    slots.push_back({"w" + std::to_string(i), 0, "h" + std::to_string(i), "cpu", id, 0});
    running.push_back({id, 0, "a", true, false, i});
    queue.push_back(Job("u" + std::to_string(i), 1, 100 + i, 10));
  }
  ScheduleResult r = s_.Schedule(queue, slots, 0, running, on_);
  EXPECT_EQ(r.preempt.size(), size_t(kMaxPreemptingPerPass) + 1);  // the head and those behind it
}

TEST(Scheduler, FairShareOrdersEqualPriorityByUsageThenSubmission) {
  Scheduler s;
  auto slot = Agents("h", 1);
  // a used 10x more than b: b's later job starts first.
  ScheduleResult r = s.Schedule({Owned("a1", 1, 1, "a", 1000), Owned("b1", 1, 2, "b", 100)}, slot, 0);
  EXPECT_EQ(Started(r), std::vector<std::string>{"b1"});
  // While the slot is busy, a's job says it waits for fair share.
  slot[0].job = "other";
  r = s.Schedule({Owned("a1", 1, 1, "a", 1000), Owned("b1", 1, 2, "b", 100)}, slot, 0);
  EXPECT_EQ(r.waiting.at("a1").rfind("FairShare: behind job b1 of b", 0), 0u) << r.waiting.at("a1");
  // Priority still comes first.
  slot[0].job = "";
  r = s.Schedule({Owned("a1", 1, 1, "a", 1000, 1), Owned("b1", 1, 2, "b", 100)}, slot, 0);
  EXPECT_EQ(Started(r), std::vector<std::string>{"a1"});
}

TEST(Scheduler, AUserAtTheRankQuotaWaitsWithoutBlockingOthers) {
  Scheduler s;
  auto slots = Agents("h", 4);
  slots[0].job = slots[1].job = "a-running";
  std::vector<RunningJob> running = {{"a-running", 0, "a", true, false, 1}};
  ScheduleResult r =
      s.Schedule({Owned("a2", 2, 2, "a", 0), Owned("b1", 1, 3, "b", 50)}, slots, 0, running, SchedulerPolicy{false, 3});
  EXPECT_EQ(Started(r), std::vector<std::string>{"b1"});
  EXPECT_EQ(r.waiting.at("a2"), "QuotaRanks: a runs 2 ranks and this job needs 2 (--user-max-ranks 3)");
  // Jobs started in the same pass count too.
  r = s.Schedule({Owned("b1", 2, 1, "b", 0), Owned("b2", 2, 2, "b", 0)}, Agents("h", 4), 0, {},
                 SchedulerPolicy{false, 3});
  EXPECT_EQ(Started(r), std::vector<std::string>{"b1"});
  EXPECT_EQ(r.waiting.at("b2").rfind("QuotaRanks: b runs 2 ranks", 0), 0u);
}

TEST(Scheduler, EveryWaitingJobSaysWhy) {
  Scheduler s;
  auto slots = Agents("h", 2);
  slots[0].job = "running";
  ScheduleResult r =
      s.Schedule({Job("head", 2, 1, 5), Job("later", 2, 2), Job("same", 2, 3, 5), Job("huge", 9, 4)}, slots, 0);
  EXPECT_EQ(r.waiting.at("head"),
            "Resources: needs 2 slots, 1 free; first in line, when is unknown (a running job "
            "has no estimate)");
  EXPECT_EQ(r.waiting.at("later"), "Priority: behind job head (priority 5), which is first in line");
  EXPECT_EQ(r.waiting.at("same"), "Resources: needs 2 slots; behind job head, which was submitted first");
  EXPECT_EQ(r.waiting.at("huge"), "Unplaceable: the pool has fewer than 9 slots of one device kind");
}

}  // namespace
}  // namespace trainyard
