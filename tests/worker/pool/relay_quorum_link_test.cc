// An elastic replica's link to the coordinator's quorum in a pool job, end to end over
// real sockets: RelayQuorumLink in the job, the relay to its agent, the agent's link,
// and a ZeroMQ ROUTER on 127.0.0.1 playing the coordinator. The agent signs each
// message as its rank's; a joiner beats while it waits; answers for another attempt,
// and late answers to earlier requests, are skipped; a fence, no answer in time, and
// the end of the steps are verdicts that commit nothing.
#include "worker/pool/relay_quorum_link.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "proto/wire_version.h"
#include "trainyard.pb.h"
#include "worker/pool/pool_agent.h"

namespace trainyard {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int64_t kJob = 7;
constexpr int kAttempt = 2;

// The coordinator's side: a ROUTER the agent connects to.
class FakeCoordinator {
 public:
  FakeCoordinator() : router_(context_, zmq::socket_type::router) { router_.bind("tcp://127.0.0.1:*"); }
  std::string endpoint() const { return router_.get(zmq::sockopt::last_endpoint); }

  // The next envelope whose body is `kind` within `timeout` (others are counted, then
  // dropped); nullopt if none came.
  std::optional<wire::Envelope> Next(wire::Envelope::BodyCase kind, milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      zmq::pollitem_t items[] = {{static_cast<void*>(router_), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, milliseconds(20));
      zmq::message_t identity, body;
      if (!router_.recv(identity, zmq::recv_flags::dontwait)) continue;
      (void)router_.recv(body);
      identity_ = identity.to_string();
      wire::Envelope e;
      if (!e.ParseFromArray(body.data(), static_cast<int>(body.size()))) continue;
      ++seen_[e.body_case()];
      if (e.body_case() == kind) return e;
    }
    return std::nullopt;
  }
  void Send(const std::function<void(wire::Envelope*)>& fill) {
    wire::Envelope e;
    e.set_version(kProtocolVersion);
    fill(&e);
    router_.send(zmq::buffer(identity_), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(e.SerializeAsString()));
  }
  int seen(wire::Envelope::BodyCase kind) { return seen_[kind]; }

 private:
  zmq::context_t context_;
  zmq::socket_t router_;
  std::string identity_;
  std::map<int, int> seen_;
};

// A decision on (quorum, step) for the test's attempt, with a next quorum when `next` > 0.
std::function<void(wire::Envelope*)> Decision(uint64_t quorum, int64_t step, bool commit, uint64_t next,
                                              int attempt = kAttempt) {
  return [=](wire::Envelope* e) {
    wire::StepDecision* d = e->mutable_step_decision();
    d->set_job_id(kJob), d->set_attempt(attempt), d->set_quorum_id(quorum), d->set_step(step);
    d->set_commit(commit), d->set_why(commit ? "" : "no vote in time: a:0");
    if (next == 0) return;
    wire::QuorumInfo* q = d->mutable_next();
    q->set_id(next), q->set_step(commit ? step + 1 : step), q->set_position(1), q->set_ring_secret("s3cret");
    wire::ReplicaRing* first = q->add_members();
    first->set_name("a:0"), first->set_host("198.18.0.1"), first->set_port(7001);
    wire::ReplicaRing* second = q->add_members();
    second->set_name("w:0"), second->set_host("198.18.0.5"), second->set_port(7100);
    q->add_heals()->set_source(0), q->mutable_heals(0)->set_target(1);
  };
}

class RelayQuorumLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PoolOptions options;
    options.endpoint = coordinator_.endpoint();
    options.insecure = true;
    options.heartbeat_s = 0.05;
    RankIdentity self;
    self.world = "w";
    self.host = "h";
    self.device = "cpu";
    self.pid = ::getpid();
    self.world_token = "t";
    self.rank_token = "r";
    agent_ = std::make_unique<PoolAgent>(options, self);
    ASSERT_TRUE(coordinator_.Next(wire::Envelope::kRegister, milliseconds(5000))) << "the agent never registered";
    assignment_.job_id = kJob;
    assignment_.attempt = kAttempt;
    agent_->Begin(assignment_);
    pump_ = std::thread([this] {
      while (!stop_) relay_.Pump(20, assignment_, *agent_);
    });
    client_ = std::make_unique<RelayClient>(relay_.endpoint());
    link_ = std::make_unique<RelayQuorumLink>(*client_, RelayQuorumOptions{"198.18.0.5", 7100, 0.2, 5, 1});
  }
  void TearDown() override {
    stop_ = true;
    if (pump_.joinable()) pump_.join();
  }

  FakeCoordinator coordinator_;
  std::unique_ptr<PoolAgent> agent_;
  Assignment assignment_;
  JobRelay relay_;
  std::atomic<bool> stop_{false};
  std::thread pump_;
  std::unique_ptr<RelayClient> client_;
  std::unique_ptr<RelayQuorumLink> link_;
};

// A join reaches the coordinator signed as the agent's rank, for its attempt, with the
// replica's ring address; beats follow while it waits; a decision for another attempt is
// not relayed; the first quorum comes back as the replica's view of it.
TEST_F(RelayQuorumLinkTest, AJoinIsSignedByTheAgentBeatsWhileItWaitsAndGetsItsQuorum) {
  auto joined = std::async(std::launch::async, [this] { return link_->Join(3, {}); });
  const std::optional<wire::Envelope> join = coordinator_.Next(wire::Envelope::kReplicaJoin, milliseconds(5000));
  ASSERT_TRUE(join);
  const wire::ReplicaJoin& j = join->replica_join();
  EXPECT_EQ(j.job_id(), kJob);
  EXPECT_EQ(j.attempt(), kAttempt);
  EXPECT_EQ(j.world(), "w");
  EXPECT_EQ(j.world_rank(), 0);
  EXPECT_EQ(j.rank_token(), "r");
  EXPECT_EQ(j.ring_host(), "198.18.0.5");
  EXPECT_EQ(j.ring_port(), 7100);
  EXPECT_EQ(j.committed_step(), 3);
  const std::optional<wire::Envelope> beat = coordinator_.Next(wire::Envelope::kReplicaBeat, milliseconds(2000));
  ASSERT_TRUE(beat) << "no beat while the joiner waits";
  EXPECT_EQ(beat->replica_beat().quorum_id(), 0u);
  EXPECT_EQ(beat->replica_beat().rank_token(), "r");
  coordinator_.Send(Decision(0, 4, false, 9, /*attempt=*/1));  // an earlier attempt's: dropped by the agent
  coordinator_.Send(Decision(0, 4, false, 4));
  ASSERT_EQ(joined.wait_for(seconds(5)), std::future_status::ready);
  const std::optional<QuorumView> view = joined.get();
  ASSERT_TRUE(view);
  EXPECT_EQ(view->id, 4u);
  EXPECT_EQ(view->step, 4);
  EXPECT_EQ(view->position, 1);
  ASSERT_EQ(view->rings.size(), 2u);
  EXPECT_EQ(view->rings[0].host, "198.18.0.1");
  EXPECT_EQ(view->rings[1].port, 7100);
  ASSERT_EQ(view->heals.size(), 1u);
  EXPECT_EQ(view->heals[0], std::make_pair(0, 1));
  EXPECT_EQ(view->secret, "s3cret");
}

// A vote waits for the decision on its own step, skipping a late one on another; the
// next quorum comes with it. A fenced vote and an unanswered one commit nothing and
// name no next quorum.
TEST_F(RelayQuorumLinkTest, AVoteGetsTheDecisionOnItsStepAndAFenceOrSilenceCommitsNothing) {
  auto voted = std::async(std::launch::async, [this] { return link_->Vote(4, 4, true, ""); });
  const std::optional<wire::Envelope> vote = coordinator_.Next(wire::Envelope::kStepVote, milliseconds(5000));
  ASSERT_TRUE(vote);
  EXPECT_EQ(vote->step_vote().quorum_id(), 4u);
  EXPECT_EQ(vote->step_vote().step(), 4);
  EXPECT_TRUE(vote->step_vote().ok());
  EXPECT_EQ(vote->step_vote().rank_token(), "r");
  coordinator_.Send(Decision(3, 4, false, 4));  // late: another quorum's
  coordinator_.Send(Decision(4, 4, true, 4));
  ASSERT_EQ(voted.wait_for(seconds(5)), std::future_status::ready);
  StepVerdict verdict = voted.get();
  EXPECT_TRUE(verdict.commit);
  ASSERT_TRUE(verdict.next);
  EXPECT_EQ(verdict.next->step, 5);

  voted = std::async(std::launch::async, [this] { return link_->Vote(4, 5, false, "the ring broke"); });
  const std::optional<wire::Envelope> failed = coordinator_.Next(wire::Envelope::kStepVote, milliseconds(5000));
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->step_vote().why(), "the ring broke");
  coordinator_.Send([](wire::Envelope* e) {
    e->mutable_fenced()->set_job_id(kJob), e->mutable_fenced()->set_attempt(kAttempt);
    e->mutable_fenced()->set_quorum_id(4), e->mutable_fenced()->set_why("w:0 is out");
  });
  verdict = voted.get();
  EXPECT_FALSE(verdict.commit);
  EXPECT_FALSE(verdict.next);
  EXPECT_EQ(verdict.why, "w:0 is out");

  const auto start = std::chrono::steady_clock::now();
  verdict = link_->Vote(5, 5, true, "");  // nobody answers
  EXPECT_FALSE(verdict.commit);
  EXPECT_FALSE(verdict.next);
  EXPECT_EQ(verdict.why, "no decision on step 5 from the coordinator within 1 s");
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(950));
}

// Once the coordinator says the steps are over, the join gets no quorum, and a later
// join returns at once without asking.
TEST_F(RelayQuorumLinkTest, StepsThatAreOverEndTheJoinAndEveryLaterOne) {
  auto joined = std::async(std::launch::async, [this] { return link_->Join(0, {}); });
  ASSERT_TRUE(coordinator_.Next(wire::Envelope::kReplicaJoin, milliseconds(5000)));
  coordinator_.Send([](wire::Envelope* e) {
    e->mutable_step_decision()->set_job_id(kJob), e->mutable_step_decision()->set_attempt(kAttempt);
    e->mutable_step_decision()->set_over(true);
  });
  ASSERT_EQ(joined.wait_for(seconds(5)), std::future_status::ready);
  EXPECT_FALSE(joined.get());
  EXPECT_TRUE(link_->over());
  EXPECT_FALSE(link_->Join(0, {}));
  EXPECT_FALSE(coordinator_.Next(wire::Envelope::kReplicaJoin, milliseconds(300))) << "nothing asked";
}

// A replica asked to stop while it waits for a quorum stops waiting within half a second.
TEST_F(RelayQuorumLinkTest, AJoinEndsWhenTheReplicaIsAskedToStop) {
  std::atomic<bool> stop{false};
  auto joined = std::async(std::launch::async, [&] { return link_->Join(0, [&] { return stop.load(); }); });
  ASSERT_TRUE(coordinator_.Next(wire::Envelope::kReplicaJoin, milliseconds(5000)));
  EXPECT_EQ(joined.wait_for(milliseconds(300)), std::future_status::timeout) << "it waits for its quorum";
  stop = true;
  ASSERT_EQ(joined.wait_for(seconds(2)), std::future_status::ready);
  EXPECT_FALSE(joined.get());
  EXPECT_FALSE(link_->over()) << "the steps are not over: this replica stops";
}

}  // namespace
}  // namespace trainyard
