// The coordinator's rank registry and listening clock, in process, on a real SQLite
// store, with the listening clock moved by hand.
#include "coordinator/rank_registry.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/listening_clock.h"
#include "coordinator/state_store.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

const std::string kWorldToken(32, 'w'), kOtherWorldToken(32, 'x');
const std::string kRankToken(32, 'r'), kOtherRankToken(32, 's');

wire::Register Registration(const std::string& world, int rank, const std::string& world_token,
                            const std::string& rank_token, const std::string& host = "h1") {
  wire::Register message;
  message.mutable_rank()->set_world(world);
  message.mutable_rank()->set_rank(rank);
  message.mutable_rank()->set_world_size(rank + 1);
  message.mutable_rank()->set_host(host);
  message.mutable_rank()->set_pid(4242);
  message.set_world_token(world_token);
  message.set_rank_token(rank_token);
  return message;
}

class RankRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_registry_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "state.db").string();
    store_ = std::make_unique<StateStore>(path_, false);
    clock_.Start(1000.0, 1.0);
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }
  // Moves the wall clock by `seconds` in wakes of at most a second: all of it is listened.
  void Listen(double seconds) {
    for (; seconds > 0; seconds -= 1.0) clock_.Advance((wall_ += std::min(1.0, seconds)));
  }
  RankRegistry::Limits limits_{3.0, 2};
  fs::path dir_;
  std::string path_;
  std::unique_ptr<StateStore> store_;
  ListeningClock clock_;
  double wall_ = 1000.0;
};

TEST(ListeningClockTest, AWakeAddsAtMostOneStepAndAStallSaysHowLongItWas) {
  ListeningClock clock;
  clock.Start(100.0, 1.0);
  EXPECT_EQ(clock.Advance(100.5), 0.0);
  EXPECT_DOUBLE_EQ(clock.Now(), 0.5);
  EXPECT_EQ(clock.Advance(101.5), 0.0);  // exactly one step is not a stall
  EXPECT_DOUBLE_EQ(clock.Now(), 1.5);
  EXPECT_DOUBLE_EQ(clock.Advance(131.5), 30.0);  // stopped for 30 s: heard for one step of it
  EXPECT_DOUBLE_EQ(clock.Now(), 2.5);
  EXPECT_EQ(clock.Advance(120.0), 0.0);  // the wall clock set back: nothing listened
  EXPECT_DOUBLE_EQ(clock.Now(), 2.5);
}

TEST_F(RankRegistryTest, ARegistrationBindsItsWorldInTheStoreAndAnotherTokenIsRefusedAfterARestart) {
  {
    RankRegistry registry(*store_, clock_, limits_);
    EXPECT_FALSE(registry.IsBound("agent-a"));
    EXPECT_FALSE(registry.Register(Registration("agent-a", 0, kWorldToken, kRankToken), "id-1", "key-1", 5.0));
    EXPECT_TRUE(registry.IsBound("agent-a"));
    EXPECT_TRUE(registry.Register(Registration("agent-a", 0, kWorldToken, kRankToken), "id-2", "key-1", 6.0))
        << "the same rank token again is a re-registration";
    EXPECT_EQ(registry.Find({"agent-a", 0})->identity, "id-2");
  }
  RankRegistry restarted(*store_, clock_, limits_);  // a new coordinator process on the same store
  EXPECT_TRUE(restarted.empty());
  EXPECT_TRUE(restarted.BoundElsewhere("agent-a", kOtherWorldToken));
  EXPECT_FALSE(restarted.BoundElsewhere("agent-a", kWorldToken));
  EXPECT_FALSE(restarted.BoundElsewhere("agent-b", kOtherWorldToken)) << "an unbound world is free";
  restarted.Bind("agent-a", kOtherWorldToken, 7.0);  // a bound world keeps its token
  EXPECT_TRUE(restarted.BoundElsewhere("agent-a", kOtherWorldToken));
  EXPECT_EQ(store_->WorldTokens().at("agent-a"), kWorldToken);
}

TEST_F(RankRegistryTest, ALiveHolderKeepsItsSlotAndASilentOneLosesItToTheWorldsToken) {
  RankRegistry registry(*store_, clock_, limits_);
  registry.Register(Registration("agent-a", 0, kWorldToken, kRankToken), "id-1", "key-1", 5.0);
  Listen(2.0);
  EXPECT_NE(registry.HolderRefusal({"agent-a", 0}, kOtherRankToken, "key-1").find("held by a live process"),
            std::string::npos);
  EXPECT_EQ(registry.HolderRefusal({"agent-a", 0}, kRankToken, "key-1"), "") << "its own process comes back";
  Listen(1.5);  // 3.5 s silent, past the 3 s limit
  EXPECT_EQ(registry.Silent(), (std::vector<RankKey>{{"agent-a", 0}}));
  EXPECT_EQ(registry.HolderRefusal({"agent-a", 0}, kOtherRankToken, "key-1"), "");
  EXPECT_FALSE(registry.Register(Registration("agent-a", 0, kWorldToken, kOtherRankToken), "id-3", "key-1", 9.0));
  EXPECT_TRUE(registry.Silent().empty());
  EXPECT_EQ(registry.Find({"agent-a", 0})->token, kOtherRankToken);
}

TEST_F(RankRegistryTest, AWorkerKeyHoldsAtMostItsCapOfRanksAndAReRegistrationDoesNotCountTwice) {
  RankRegistry registry(*store_, clock_, limits_);  // a cap of 2
  registry.Register(Registration("agent-a", 0, kWorldToken, kRankToken), "id-1", "key-1", 5.0);
  registry.Register(Registration("agent-b", 0, kWorldToken, kRankToken), "id-2", "key-1", 5.0);
  EXPECT_EQ(registry.RanksOfKey("key-1", {"", 0}), 2);
  EXPECT_NE(registry.HolderRefusal({"agent-c", 0}, kRankToken, "key-1").find("--max-ranks-per-worker-key"),
            std::string::npos);
  EXPECT_EQ(registry.HolderRefusal({"agent-b", 0}, kRankToken, "key-1"), "");
  EXPECT_EQ(registry.HolderRefusal({"agent-c", 0}, kRankToken, "key-2"), "") << "another key has its own cap";
  EXPECT_EQ(registry.HolderRefusal({"agent-c", 0}, kRankToken, ""), "") << "no key: an insecure coordinator";
}

TEST_F(RankRegistryTest, OnlyTheRanksOwnTokenAuthenticatesItsMessages) {
  RankRegistry registry(*store_, clock_, limits_);
  registry.Register(Registration("agent-a", 0, kWorldToken, kRankToken), "id-1", "key-1", 5.0);
  std::string why;
  EXPECT_NE(registry.Authenticated({"agent-a", 0}, kRankToken, &why), nullptr);
  EXPECT_EQ(registry.Authenticated({"agent-a", 0}, kOtherRankToken, &why), nullptr);
  EXPECT_EQ(why, "rank 0 of world agent-a with a token that is not its own");
  EXPECT_EQ(registry.Authenticated({"agent-a", 0}, "", &why), nullptr);
  EXPECT_EQ(registry.Authenticated({"agent-z", 0}, kRankToken, &why), nullptr);
  EXPECT_EQ(why, "rank 0 of world agent-z which is not registered");
  EXPECT_EQ(registry.Describe({"agent-a", 0}), "agent agent-a (pid 4242 on h1)");
  EXPECT_EQ(registry.Describe({"world-9", 3}), "rank 3 of world world-9");
}

TEST_F(RankRegistryTest, HeartbeatsKeepARankAliveAndAStallGivesEveryRankAFreshWindow) {
  RankRegistry registry(*store_, clock_, limits_);
  registry.Register(Registration("agent-a", 0, kWorldToken, kRankToken, "h1"), "id-1", "key-1", 5.0);
  registry.Register(Registration("agent-b", 0, kWorldToken, kRankToken, "h2"), "id-2", "key-2", 5.0);
  wire::Heartbeat beat;
  beat.set_job_id(7);
  beat.set_attempt(2);
  beat.set_last_log_line("epoch 1");
  for (int i = 0; i < 5; ++i) {
    Listen(1.0);
    registry.NoteHeartbeat(registry.Find({"agent-a", 0}), "id-9", beat);
  }
  EXPECT_EQ(registry.Silent(), (std::vector<RankKey>{{"agent-b", 0}}));
  const RankEntry& a = *registry.Find({"agent-a", 0});
  EXPECT_EQ(a.job, 7);
  EXPECT_EQ(a.attempt, 2);
  EXPECT_EQ(a.last_log_line, "epoch 1");
  EXPECT_EQ(a.identity, "id-9");
  registry.HearAllNow();
  EXPECT_TRUE(registry.Silent().empty());
  EXPECT_EQ(registry.OnHost("h2")->first, (RankKey{"agent-b", 0}));
  EXPECT_EQ(registry.OnHost("h3"), nullptr);
  registry.Remove({"agent-b", 0});
  EXPECT_EQ(registry.OnHost("h2"), nullptr);
}

TEST_F(RankRegistryTest, SquatsAreCountedAndOnlyTheNewestWarningsAreKept) {
  RankRegistry registry(*store_, clock_, limits_);
  const size_t kept = RankRegistry::kKeptWarnings;
  for (size_t i = 0; i < kept + 5; ++i) registry.NoteSquat("squat " + std::to_string(i), double(i));
  EXPECT_EQ(registry.squat_attempts(), int64_t(kept + 5));
  ASSERT_EQ(registry.warnings().size(), kept);
  EXPECT_EQ(registry.warnings().front().text, "squat 5");
  EXPECT_EQ(registry.warnings().back().text, "squat " + std::to_string(kept + 4));
}

}  // namespace
}  // namespace trainyard
