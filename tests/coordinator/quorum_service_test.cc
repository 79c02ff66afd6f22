// An elastic job's step quorum (Note [Step quorum]) on a clock the test moves: forming,
// committing, a member dead, frozen or back as a new process, joiners healed, stale
// views fenced, and a step that keeps failing given up.
#include "coordinator/quorum_service.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace trainyard {
namespace {

QuorumService::Options Policy(int min, int max) {
  QuorumService::Options o;
  o.min_replicas = min;
  o.max_replicas = max;
  o.timeout_s = 5;
  o.join_window_s = 10;
  return o;
}

ReplicaAddress Ring(int port) { return {"198.18.0.1", port}; }

// The one decision `Advance(now)` made.
StepDecision OnlyDecision(QuorumService& q, double now) {
  std::vector<StepDecision> made = q.Advance(now);
  EXPECT_EQ(made.size(), 1u);
  return made.empty() ? StepDecision{} : made.front();
}

// a and b join at 0, form a quorum and commit step 1 at 1: the quorum for step 2.
Quorum TwoCommitTheFirstStep(QuorumService& q) {
  q.Join("a", Ring(1), 0, 0);
  q.Join("b", Ring(2), 0, 0);
  const Quorum first = *OnlyDecision(q, 0.5).next;
  q.Vote("a", first.id, 1, true, 1);
  q.Vote("b", first.id, 1, true, 1);
  return *OnlyDecision(q, 1).next;
}

// A quorum waits for max_replicas, or for the join window once min_replicas are in; its
// members are in ring order by name with their addresses, its id after the store's last,
// its step after the furthest step committed.
TEST(QuorumServiceTest, AQuorumFormsWhenAllHaveJoinedOrTheWindowHasPassed) {
  QuorumService q(Policy(2, 3), 41);
  q.Join("b", Ring(2), 0, 0);
  EXPECT_TRUE(q.Advance(1).empty()) << "one replica, two needed";
  q.Join("a", Ring(1), 0, 2);
  for (double t = 3; t <= 9; t += 1) {  // both live: a joiner silent for the timeout is dropped
    q.Beat("a", 0, t);
    q.Beat("b", 0, t);
  }
  EXPECT_TRUE(q.Advance(9).empty()) << "two of three, the window (from b's join) still open";
  const StepDecision formed = OnlyDecision(q, 10);
  ASSERT_TRUE(formed.next);
  EXPECT_EQ(formed.next->id, 42u);
  EXPECT_EQ(formed.next->step, 1);
  EXPECT_EQ(formed.next->members, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(formed.next->rings, (std::vector<ReplicaAddress>{Ring(1), Ring(2)}));
  ASSERT_EQ(formed.next->heals.size(), 1u) << "step 1: every member starts from the first one's state";
  EXPECT_EQ(formed.next->heals[0].source, "a");
  EXPECT_EQ(formed.next->heals[0].target, "b");

  QuorumService full(Policy(2, 3), 0);
  for (const char* name : {"x", "y", "z"}) full.Join(name, Ring(7), 0, 0);
  EXPECT_EQ(OnlyDecision(full, 0.1).next->members.size(), 3u) << "all three in: no wait for the window";
}

// Every member ok: the step commits and the same quorum, same id, goes on to the next
// step. One vote alone decides nothing.
TEST(QuorumServiceTest, AStepCommitsWhenEveryMemberVotedOk) {
  QuorumService q(Policy(2, 2), 0);
  q.Join("a", Ring(1), 0, 0);
  q.Join("b", Ring(2), 0, 0);
  const uint64_t id = OnlyDecision(q, 0.5).next->id;
  EXPECT_EQ(q.Vote("a", id, 1, true, 1), VoteAnswer::kCounted);
  EXPECT_TRUE(q.Advance(1.5).empty());
  EXPECT_EQ(q.Vote("b", id, 1, true, 2), VoteAnswer::kCounted);
  const StepDecision d = OnlyDecision(q, 2);
  EXPECT_TRUE(d.commit);
  EXPECT_EQ(d.step, 1);
  ASSERT_TRUE(d.next);
  EXPECT_EQ(d.next->id, id);
  EXPECT_EQ(d.next->step, 2);
}

// A member whose process ended: the step does not commit, and the survivor retries the
// same step in a new quorum at once (min 1). A new replica joining later is taken in
// at the next step boundary, healed from the survivor.
TEST(QuorumServiceTest, ADeadMemberFailsTheStepAndTheSurvivorsRetryItWithoutIt) {
  QuorumService q(Policy(1, 2), 0);
  q.Join("a", Ring(1), 0, 0);
  q.Join("b", Ring(2), 0, 0);
  const Quorum first = *OnlyDecision(q, 0.5).next;
  q.Vote("a", first.id, 1, false, 1);  // its ring broke: b's connection closed
  q.RemoveReplica("b", 1.2);           // b's exit, reported by its agent
  const StepDecision d = OnlyDecision(q, 1.3);
  EXPECT_FALSE(d.commit);
  EXPECT_NE(d.why.find("left the step: b"), std::string::npos) << d.why;
  ASSERT_TRUE(d.next);
  EXPECT_GT(d.next->id, first.id);
  EXPECT_EQ(d.next->step, 1) << "the same step again";
  EXPECT_EQ(d.next->members, std::vector<std::string>{"a"});

  q.Join("c", Ring(3), 0, 2);  // a new process on another host
  q.Vote("a", d.next->id, 1, true, 3);
  const StepDecision committed = OnlyDecision(q, 3);
  EXPECT_TRUE(committed.commit);
  ASSERT_TRUE(committed.next);
  EXPECT_EQ(committed.next->step, 2);
  EXPECT_EQ(committed.next->members, (std::vector<std::string>{"a", "c"}));
  ASSERT_EQ(committed.next->heals.size(), 1u);
  EXPECT_EQ(committed.next->heals[0].source, "a");
  EXPECT_EQ(committed.next->heals[0].target, "c");
}

// A member alive but frozen (it beats, or not, but never votes) is out at the step's
// deadline, not before; its late vote and its beats naming the old quorum are fenced,
// and it takes part again only by joining as a new replica.
TEST(QuorumServiceTest, AFrozenMemberIsOutAtTheDeadlineAndItsOldViewIsFenced) {
  QuorumService q(Policy(1, 2), 0);
  q.Join("a", Ring(1), 0, 0);
  q.Join("b", Ring(2), 0, 0);
  const Quorum first = *OnlyDecision(q, 1).next;  // given at 1; the timeout is 5 s
  q.Vote("a", first.id, 1, true, 2);
  q.Beat("b", first.id, 3);
  EXPECT_TRUE(q.Advance(5.9).empty());
  const StepDecision d = OnlyDecision(q, 6);
  EXPECT_FALSE(d.commit);
  EXPECT_NE(d.why.find("no vote in time: b"), std::string::npos) << d.why;
  EXPECT_EQ(d.next->members, std::vector<std::string>{"a"});
  EXPECT_EQ(q.Vote("b", first.id, 1, true, 7), VoteAnswer::kFenced);
  EXPECT_EQ(q.Beat("b", first.id, 7), VoteAnswer::kFenced);
  EXPECT_EQ(q.Vote("b", d.next->id, 1, true, 7), VoteAnswer::kFenced) << "not a member of the new quorum";
  q.Join("b", Ring(2), 0, 8);
  EXPECT_EQ(q.Beat("b", 0, 8.5), VoteAnswer::kCounted);
}

// Votes and beats that cannot be right are fenced and change nothing.
TEST(QuorumServiceTest, MessagesOfAnotherQuorumOrStepOrFromStrangersAreFenced) {
  QuorumService q(Policy(2, 2), 0);
  EXPECT_EQ(q.Beat("nobody", 0, 0), VoteAnswer::kFenced) << "never joined";
  q.Join("a", Ring(1), 0, 0);
  q.Join("b", Ring(2), 0, 0);
  const Quorum first = *OnlyDecision(q, 0.5).next;
  EXPECT_EQ(q.Vote("a", first.id + 1, 1, true, 1), VoteAnswer::kFenced);
  EXPECT_EQ(q.Vote("a", first.id, 2, true, 1), VoteAnswer::kFenced) << "another step";
  EXPECT_EQ(q.Beat("a", first.id + 1, 1), VoteAnswer::kFenced) << "a quorum never given";
  EXPECT_EQ(q.Vote("c", first.id, 1, true, 1), VoteAnswer::kFenced);
  EXPECT_TRUE(q.Advance(1).empty()) << "none of those counted as a vote";
}

// A member that comes back as a new process (same name) while its quorum runs: its old
// process left the step, which fails; the retry takes the new one in, healed.
TEST(QuorumServiceTest, AMemberBackAsANewProcessFailsItsStepAndIsHealedInTheRetry) {
  QuorumService q(Policy(2, 2), 0);
  q.Join("a", Ring(1), 4, 0);
  q.Join("b", Ring(2), 4, 0);
  const Quorum first = *OnlyDecision(q, 0.5).next;
  EXPECT_EQ(first.step, 5);
  q.Vote("a", first.id, 5, true, 1);
  q.Join("b", Ring(9), 0, 1.5);  // restarted: it has committed nothing
  const StepDecision d = OnlyDecision(q, 2);
  EXPECT_FALSE(d.commit);
  ASSERT_TRUE(d.next);
  EXPECT_EQ(d.next->step, 5);
  EXPECT_EQ(d.next->rings[1], Ring(9));
  ASSERT_EQ(d.next->heals.size(), 1u);
  EXPECT_EQ(d.next->heals[0].target, "b");
}

// A member that joins again as the same process (same ring address, at the quorum's
// step, not yet voted) missed the news of its quorum: it stays a member, and the step
// goes on. One that has voted, or comes from another address, is a new process.
TEST(QuorumServiceTest, AMemberThatMissedItsQuorumStaysInIt) {
  QuorumService q(Policy(2, 2), 0);
  q.Join("a", Ring(1), 4, 0);
  q.Join("b", Ring(2), 4, 0);
  const Quorum first = *OnlyDecision(q, 0.5).next;
  EXPECT_TRUE(q.Join("b", Ring(2), 4, 1));
  q.Vote("a", first.id, 5, true, 1.2);
  q.Vote("b", first.id, 5, true, 1.3);
  EXPECT_TRUE(OnlyDecision(q, 1.4).commit);
  q.Vote("a", first.id, 6, true, 2);
  EXPECT_FALSE(q.Join("a", Ring(1), 5, 2.1)) << "a has voted on step 6";
  q.Vote("b", first.id, 6, true, 2.15);
  EXPECT_FALSE(OnlyDecision(q, 2.2).commit) << "a left the step";
}

// Below min_replicas no quorum is given (the job waits); one forms again, after the
// furthest step committed, once enough are back.
TEST(QuorumServiceTest, BelowTheMinimumTheJobWaitsForJoins) {
  QuorumService q(Policy(2, 2), 0);
  const Quorum second = TwoCommitTheFirstStep(q);
  q.RemoveReplica("b", 2);
  EXPECT_TRUE(q.Advance(2).empty()) << "a's vote is still to come";
  q.Vote("a", second.id, 2, false, 2.1);  // its ring broke with b gone
  const StepDecision d = OnlyDecision(q, 2.2);
  EXPECT_FALSE(d.commit);
  EXPECT_FALSE(d.next) << "one replica, two needed";
  EXPECT_FALSE(q.current());
  q.Beat("a", 0, 3);
  q.Join("c", Ring(3), 0, 4);
  const StepDecision again = OnlyDecision(q, 4.5);
  ASSERT_TRUE(again.next);
  EXPECT_GT(again.next->id, second.id);
  EXPECT_EQ(again.next->step, 2) << "after the step a committed";
  EXPECT_EQ(again.next->heals.size(), 1u);
}

// A step that fails every time with all its members there is the job's own failure: it
// is given up after kMaxRetries, and no quorum forms again.
TEST(QuorumServiceTest, AStepThatKeepsFailingWithEveryMemberThereIsGivenUp) {
  QuorumService q(Policy(2, 2), 0);
  q.Join("a", Ring(1), 0, 0);
  q.Join("b", Ring(2), 0, 0);
  Quorum quorum = *OnlyDecision(q, 0.5).next;
  for (int attempt = 1; attempt <= QuorumService::kMaxRetries; ++attempt) {
    q.Vote("a", quorum.id, 1, false, attempt);
    q.Vote("b", quorum.id, 1, true, attempt);
    const StepDecision d = OnlyDecision(q, attempt);
    EXPECT_FALSE(d.commit);
    if (attempt < QuorumService::kMaxRetries) {
      ASSERT_TRUE(d.next);
      quorum = *d.next;
    } else {
      EXPECT_FALSE(d.next);
      EXPECT_NE(d.why.find("failed 3 times in a row"), std::string::npos) << d.why;
    }
  }
  EXPECT_TRUE(q.given_up());
  q.Beat("a", 0, 10);
  q.Beat("b", 0, 10);
  EXPECT_TRUE(q.Advance(30).empty());
}

// Once every replica that took the last committed step is gone, no quorum forms from
// the joiners left: healing from nobody would train again from an older state. The
// steps give up, saying so, and the checkpoints are the way on.
TEST(QuorumServiceTest, NoQuorumFormsWithoutTheLastCommittedStepsState) {
  QuorumService q(Policy(1, 2), 0);
  const Quorum second = TwoCommitTheFirstStep(q);
  q.RemoveReplica("b", 2);
  q.Join("c", Ring(3), 0, 2.5);  // a new replica, with nothing committed
  q.RemoveReplica("a", 3);       // the last holder of step 1's state
  const StepDecision d = OnlyDecision(q, 3);
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.quorum_id, second.id);
  EXPECT_FALSE(d.next) << "c alone would start again from nothing";
  EXPECT_NE(d.why.find("no live replica holds the state of step 1"), std::string::npos) << d.why;
  EXPECT_TRUE(q.given_up());

  QuorumService waiting(Policy(2, 2), 0);  // no quorum stands when the holder goes
  const Quorum next = TwoCommitTheFirstStep(waiting);
  waiting.RemoveReplica("b", 2);
  waiting.Vote("a", next.id, 2, false, 2);
  EXPECT_FALSE(OnlyDecision(waiting, 2).next) << "below the minimum: a waits";
  waiting.RemoveReplica("a", 3);
  waiting.Join("c", Ring(3), 0, 4);
  waiting.Join("d", Ring(4), 0, 4);
  const StepDecision gave_up = OnlyDecision(waiting, 4.5);
  EXPECT_FALSE(gave_up.next);
  EXPECT_NE(gave_up.why.find("no live replica holds the state of step 1"), std::string::npos) << gave_up.why;
  EXPECT_TRUE(waiting.given_up());
}

// A replica took the last step: the steps are over, and joiners get no quorum.
TEST(QuorumServiceTest, FinishEndsTheSteps) {
  QuorumService q(Policy(1, 2), 0);
  q.Join("a", Ring(1), 0, 0);
  q.Join("b", Ring(2), 0, 0);
  const Quorum first = *OnlyDecision(q, 0.5).next;
  q.Vote("a", first.id, 1, true, 1);
  q.Vote("b", first.id, 1, true, 1);
  ASSERT_TRUE(OnlyDecision(q, 1).commit);
  q.Finish();
  EXPECT_TRUE(q.given_up());
  EXPECT_FALSE(q.current());
  q.Join("c", Ring(3), 0, 2);
  EXPECT_TRUE(q.Advance(20).empty());
}

}  // namespace
}  // namespace trainyard
