// The coordinator's side of elastic quorums on the wire (coordinator/elastic_quorums.h),
// on a real SQLite store and a clock the test moves: joiners answered with their first
// quorum, voters with their step's decision, silent members out and fenced, a member's
// end deciding at once, heals named by ring position, ids kept across a restart, a
// step that keeps failing given up, and bad input refused without a trace.
#include "coordinator/elastic_quorums.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/state_store.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr int kAttempt = 1;

QuorumService::Options Policy(int min, int max) {
  QuorumService::Options o;
  o.min_replicas = min;
  o.max_replicas = max;
  o.timeout_s = 5;
  o.join_window_s = 10;
  return o;
}

class ElasticQuorumsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_quorums_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "state.db").string();
    store_ = std::make_unique<StateStore>(path_, false);
    NewJob job;
    job.name = "elastic";
    job.spec_yaml = "name: elastic\n";
    job.source = "job.yaml";
    job.ranks = 1;
    bool created = false;
    job_ = store_->Submit(job, 100, &created).id;
    quorums_ = std::make_unique<ElasticQuorums>(*store_);
  }
  void TearDown() override {
    quorums_.reset();
    store_.reset();
    fs::remove_all(dir_);
  }

  wire::ReplicaJoin JoinMessage(int port, int64_t committed = 0) const {
    wire::ReplicaJoin join;
    join.set_job_id(job_);
    join.set_attempt(kAttempt);
    join.set_ring_host("198.18.0.1");
    join.set_ring_port(port);
    join.set_committed_step(committed);
    return join;
  }
  std::string Join(const std::string& replica, int port, double now, int64_t committed = 0) {
    return quorums_->Join("id-" + replica, replica, JoinMessage(port, committed), now);
  }
  std::string Vote(const std::string& replica, uint64_t quorum, int64_t step, bool ok, double now) {
    wire::StepVote vote;
    vote.set_job_id(job_);
    vote.set_attempt(kAttempt);
    vote.set_quorum_id(quorum);
    vote.set_step(step);
    vote.set_ok(ok);
    vote.set_why(ok ? "" : "the ring broke");
    return quorums_->Vote("id-" + replica, replica, vote, now);
  }
  // What was sent since the last call, by recipient (one message each).
  std::map<std::string, wire::Envelope> Sent() {
    std::map<std::string, wire::Envelope> by_identity;
    for (QuorumMessage& m : quorums_->TakeMessages()) {
      EXPECT_FALSE(by_identity.count(m.identity)) << "two messages for " << m.identity;
      by_identity[m.identity] = std::move(m.message);
    }
    return by_identity;
  }

  fs::path dir_;
  std::string path_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<ElasticQuorums> quorums_;
  int64_t job_ = 0;
};

// Two replicas of two: the second join forms the quorum, and each joiner hears of it
// with its own ring position, every member's ring address and the attempt's secret.
// Both voting ok commits the step: each voter hears of it, with the same quorum for
// the next step. Only the forming is an event; the id is in the store.
TEST_F(ElasticQuorumsTest, JoinersHearOfTheirQuorumAndVotersOfTheirStep) {
  quorums_->Open(job_, kAttempt, Policy(2, 2));
  EXPECT_EQ(Join("w2:0", 7002, 0), "");
  EXPECT_TRUE(Sent().empty()) << "one joiner of two waits";
  EXPECT_EQ(Join("w1:0", 7001, 0.5), "");
  auto sent = Sent();
  ASSERT_EQ(sent.size(), 2u);
  std::string secret;
  for (const auto& [replica, position] : std::map<std::string, int>{{"w1:0", 0}, {"w2:0", 1}}) {
    SCOPED_TRACE(replica);
    const wire::StepDecision& d = sent.at("id-" + replica).step_decision();
    EXPECT_EQ(d.job_id(), job_);
    EXPECT_EQ(d.attempt(), kAttempt);
    EXPECT_EQ(d.quorum_id(), 0u) << "an answer to a join";
    ASSERT_TRUE(d.has_next());
    EXPECT_EQ(d.next().id(), 1u);
    EXPECT_EQ(d.next().step(), 1);
    EXPECT_EQ(d.next().position(), position);
    ASSERT_EQ(d.next().members_size(), 2);
    EXPECT_EQ(d.next().members(0).name(), "w1:0");
    EXPECT_EQ(d.next().members(0).port(), 7001);
    EXPECT_EQ(d.next().members(1).host(), "198.18.0.1");
    EXPECT_EQ(d.next().members(1).port(), 7002);
    EXPECT_GE(d.next().ring_secret().size(), 32u);
    if (secret.empty()) secret = d.next().ring_secret();
    EXPECT_EQ(d.next().ring_secret(), secret) << "one secret for the attempt";
  }
  EXPECT_EQ(store_->LastQuorumId(job_), 1u);
  const auto events = quorums_->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text,
            "quorum 1 formed for step 1: w1:0, w2:0 (w2:0 healed from w1:0), 0.5 s after the first join");

  EXPECT_EQ(Vote("w1:0", 1, 1, true, 1), "");
  EXPECT_TRUE(Sent().empty()) << "one vote of two decides nothing";
  EXPECT_EQ(Vote("w2:0", 1, 1, true, 1.2), "");
  sent = Sent();
  ASSERT_EQ(sent.size(), 2u);
  for (const auto& [identity, message] : sent) {
    const wire::StepDecision& d = message.step_decision();
    EXPECT_EQ(d.quorum_id(), 1u);
    EXPECT_EQ(d.step(), 1);
    EXPECT_TRUE(d.commit());
    EXPECT_EQ(d.next().id(), 1u);
    EXPECT_EQ(d.next().step(), 2);
    EXPECT_FALSE(d.over());
  }
  EXPECT_TRUE(quorums_->TakeEvents().empty()) << "a committed step in the same quorum is no event";
}

// A member that does not vote in time is out: the voter hears, at the deadline, that
// the step did not commit and that it retries the step in a new quorum of its own; the
// late vote, and a beat naming the old quorum, are fenced.
TEST_F(ElasticQuorumsTest, ASilentMemberIsOutAtTheDeadlineAndItsLateVoteIsFenced) {
  quorums_->Open(job_, kAttempt, Policy(1, 2));
  Join("a:0", 7001, 0);
  Join("b:0", 7002, 0);
  Sent();
  quorums_->TakeEvents();
  Vote("a:0", 1, 1, true, 1);
  quorums_->Advance(4.9);
  EXPECT_TRUE(Sent().empty()) << "before the deadline";
  quorums_->Advance(5.0);
  auto sent = Sent();
  ASSERT_EQ(sent.size(), 1u);
  const wire::StepDecision& d = sent.at("id-a:0").step_decision();
  EXPECT_FALSE(d.commit());
  EXPECT_EQ(d.why(), "no vote in time: b:0");
  ASSERT_TRUE(d.has_next());
  EXPECT_EQ(d.next().id(), 2u);
  EXPECT_EQ(d.next().step(), 1) << "the same step again";
  ASSERT_EQ(d.next().members_size(), 1);
  EXPECT_EQ(store_->LastQuorumId(job_), 2u);
  const auto events = quorums_->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text,
            "step 1 of quorum 1 did not commit after 5.0 s (no vote in time: b:0); quorum 2 formed for step 1: a:0");

  EXPECT_EQ(Vote("b:0", 1, 1, true, 6), "");
  sent = Sent();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent.at("id-b:0").fenced().quorum_id(), 1u);
  wire::ReplicaBeat beat;
  beat.set_job_id(job_);
  beat.set_attempt(kAttempt);
  beat.set_quorum_id(1);
  EXPECT_EQ(quorums_->Beat("id-b:0", "b:0", beat, 6.5), "");
  EXPECT_TRUE(Sent().at("id-b:0").has_fenced());
  beat.set_quorum_id(2);
  EXPECT_EQ(quorums_->Beat("id-a:0", "a:0", beat, 6.5), "");
  EXPECT_TRUE(Sent().empty()) << "a member's beat is not answered";
}

// A member whose process ended decides the step at once, without waiting for the
// deadline; a replica behind the others is healed from one that is not, named by ring
// positions.
TEST_F(ElasticQuorumsTest, AMemberGoneDecidesAtOnceAndAJoinerBehindIsHealed) {
  quorums_->Open(job_, kAttempt, Policy(1, 2));
  Join("a:0", 7001, 0, 4);
  Join("b:0", 7002, 0, 4);
  auto sent = Sent();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent.at("id-a:0").step_decision().next().step(), 5);
  Vote("a:0", 1, 5, true, 1);
  quorums_->ReplicaGone("b:0", 1.5);
  sent = Sent();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent.at("id-a:0").step_decision().why(), "left the step: b:0");
  ASSERT_EQ(sent.at("id-a:0").step_decision().next().members_size(), 1);

  Join("c:0", 7003, 2, 0);  // a new replica, behind: it waits for a step boundary
  EXPECT_TRUE(Sent().empty());
  Vote("a:0", 2, 5, true, 2.5);
  sent = Sent();
  ASSERT_EQ(sent.size(), 2u) << "a's decision and c's first quorum";
  const wire::QuorumInfo& next = sent.at("id-c:0").step_decision().next();
  EXPECT_EQ(next.id(), 3u);
  EXPECT_EQ(next.step(), 6);
  EXPECT_EQ(next.position(), 1);
  ASSERT_EQ(next.heals_size(), 1);
  EXPECT_EQ(next.heals(0).source(), 0);
  EXPECT_EQ(next.heals(0).target(), 1);
  EXPECT_TRUE(sent.at("id-a:0").step_decision().commit());
  EXPECT_EQ(sent.at("id-a:0").step_decision().next().id(), 3u);
}

// A step that fails with every member there, kMaxRetries times, gives up: each voter
// is told the steps are over, and so is a replica that joins afterwards.
TEST_F(ElasticQuorumsTest, AStepThatKeepsFailingGivesUpAndSaysSoToEveryone) {
  quorums_->Open(job_, kAttempt, Policy(1, 1));
  Join("a:0", 7001, 0);
  uint64_t quorum = Sent().at("id-a:0").step_decision().next().id();
  for (int i = 0; i < QuorumService::kMaxRetries; ++i) {
    Vote("a:0", quorum, 1, false, 1 + i);
    const wire::StepDecision d = Sent().at("id-a:0").step_decision();
    EXPECT_FALSE(d.commit());
    EXPECT_EQ(d.over(), i + 1 == QuorumService::kMaxRetries);
    if (!d.over()) quorum = d.next().id();
  }
  EXPECT_NE(quorums_->TakeEvents().back().text.find("; the steps give up"), std::string::npos);
  Join("a:0", 7001, 10);
  EXPECT_TRUE(Sent().at("id-a:0").step_decision().over());
}

// A member's join again as the same process (its quorum's news lost on the way) is
// answered with the quorum it is in.
TEST_F(ElasticQuorumsTest, AMemberJoiningAgainIsToldItsQuorumAgain) {
  quorums_->Open(job_, kAttempt, Policy(2, 2));
  Join("a:0", 7001, 0);
  Join("b:0", 7002, 0);
  const uint64_t quorum = Sent().at("id-b:0").step_decision().next().id();
  Join("b:0", 7002, 0.5);
  const wire::StepDecision again = Sent().at("id-b:0").step_decision();
  ASSERT_TRUE(again.has_next());
  EXPECT_EQ(again.next().id(), quorum);
  EXPECT_EQ(again.next().position(), 1);
  EXPECT_FALSE(again.next().ring_secret().empty());
}

// A replica took the last step (Finish): a replica still waiting to join is told the
// steps are over, and so is one that joins later; the lost state's give-up is an event.
TEST_F(ElasticQuorumsTest, FinishTellsWaitingJoinersTheStepsAreOver) {
  quorums_->Open(job_, kAttempt, Policy(1, 1));
  Join("a:0", 7001, 0);
  const uint64_t quorum = Sent().at("id-a:0").step_decision().next().id();
  Vote("a:0", quorum, 1, true, 1);
  Sent();
  Join("b:0", 7002, 2);  // no room: it waits at the boundary
  EXPECT_TRUE(Sent().empty());
  quorums_->Finish(job_, kAttempt);
  const wire::StepDecision over = Sent().at("id-b:0").step_decision();
  EXPECT_TRUE(over.over());
  EXPECT_FALSE(over.has_next());
  Join("c:0", 7003, 3);
  EXPECT_TRUE(Sent().at("id-c:0").step_decision().over());
}

// Ids only grow: a new ElasticQuorums (a coordinator restart) on the same store, and a
// later attempt of the job, go on from the store's last id.
TEST_F(ElasticQuorumsTest, QuorumIdsGoOnFromTheStoreAcrossARestartAndAttempts) {
  quorums_->Open(job_, kAttempt, Policy(1, 1));
  Join("a:0", 7001, 0);
  Vote("a:0", 1, 1, false, 1);  // a retry: quorum 2
  EXPECT_EQ(store_->LastQuorumId(job_), 2u);
  quorums_.reset();
  store_.reset();
  store_ = std::make_unique<StateStore>(path_, false);
  quorums_ = std::make_unique<ElasticQuorums>(*store_);
  quorums_->Open(job_, 2, Policy(1, 1));
  wire::ReplicaJoin join = JoinMessage(7001);
  join.set_attempt(2);
  quorums_->Join("id-a", "a:0", join, 0);
  EXPECT_EQ(Sent().at("id-a").step_decision().next().id(), 3u);
  store_->KeepQuorumId(job_, 1);
  EXPECT_EQ(store_->LastQuorumId(job_), 3u) << "never lowered";
}

// A join with a bad ring address or step, or for an attempt with no quorum (not
// elastic, or closed), is refused and changes nothing.
TEST_F(ElasticQuorumsTest, BadJoinsAndUnknownAttemptsAreRefusedWithoutATrace) {
  EXPECT_EQ(Join("a:0", 7001, 0),
            "job " + std::to_string(job_) + " attempt 1 has no elastic quorum (it is not elastic, or over)");
  quorums_->Open(job_, kAttempt, Policy(1, 1));
  wire::ReplicaJoin join = JoinMessage(7001);
  for (const std::string& host : {std::string(), std::string("a host"), std::string(254, 'h'), std::string("h\n")}) {
    join.set_ring_host(host);
    EXPECT_NE(quorums_->Join("id", "a:0", join, 0).find("ring host"), std::string::npos) << host;
  }
  join = JoinMessage(0);
  EXPECT_EQ(quorums_->Join("id", "a:0", join, 0), "a replica's ring port must be in 1..65535");
  join = JoinMessage(65536);
  EXPECT_EQ(quorums_->Join("id", "a:0", join, 0), "a replica's ring port must be in 1..65535");
  join = JoinMessage(7001, -1);
  EXPECT_EQ(quorums_->Join("id", "a:0", join, 0), "a replica's committed step must be 0 or more");
  EXPECT_EQ(Vote("a:0", 1, 1, true, 0), "") << "no quorum yet: fenced, not refused";
  EXPECT_TRUE(Sent().at("id-a:0").has_fenced());
  EXPECT_TRUE(quorums_->TakeEvents().empty());
  EXPECT_EQ(store_->LastQuorumId(job_), 0u);
  quorums_->Close(job_, kAttempt);
  EXPECT_FALSE(quorums_->IsOpen(job_, kAttempt));
  EXPECT_NE(Join("a:0", 7001, 0), "");
}

}  // namespace
}  // namespace trainyard
