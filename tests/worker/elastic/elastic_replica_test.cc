// Elastic steps (Note [Elastic steps]) with real replica rings over loopback TCP and the
// coordinator's real QuorumService, reached in process (the wire's part is not under
// test here), a thread a replica: a replica dies mid-run, a new one joins and is
// healed from a live peer, and every replica ends with the weights of a run without
// failures over the same global batches.
#include "worker/elastic/elastic_replica.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "coordinator/quorum_service.h"
#include "tests/worker/elastic/in_process_quorum.h"

namespace trainyard {
namespace {

constexpr int64_t kBatch = 24;  // examples a step
constexpr size_t kWeights = 4096;
constexpr float kLr = 0.5f;

// The gradient of example `x` of step `step` (independent of the weights, so a run's
// weights have a closed form to check against).
float Gradient(int64_t step, int64_t x, size_t j) {
  return static_cast<float>(std::sin(0.01 * double(j) + 0.7 * double(x) + 0.3 * double(step)) * 1e-2);
}

// A replica's model: weights under plain SGD, its state the weights' bytes.
struct ToyModel {
  std::vector<float> weights = std::vector<float>(kWeights, 1.0f);
  std::vector<int64_t> applied;  // the steps it applied, in order
  ElasticModel View() {
    ElasticModel m;
    m.gradient_size = kWeights;
    m.accumulate = [](int64_t step, int position, int members, std::vector<float>* sum) {
      for (int64_t x = kBatch * position / members; x < kBatch * (position + 1) / members; ++x)
        for (size_t j = 0; j < kWeights; ++j) (*sum)[j] += Gradient(step, x, j) / float(kBatch);
    };
    m.apply = [this](int64_t step, const std::vector<float>& g) {
      for (size_t j = 0; j < kWeights; ++j) weights[j] -= kLr * g[j];
      applied.push_back(step);
    };
    m.save = [this] {
      std::vector<uint8_t> bytes(kWeights * sizeof(float));
      std::memcpy(bytes.data(), weights.data(), bytes.size());
      return bytes;
    };
    m.load = [this](const std::vector<uint8_t>& bytes) { std::memcpy(weights.data(), bytes.data(), bytes.size()); };
    return m;
  }
};

struct DiedMidStep {};
constexpr int64_t kLast = 20;

// What each replica's thread came to.
struct Replicas {
  std::map<std::string, ToyModel> models;
  std::map<std::string, int64_t> reached;  // the last step each committed
  std::map<std::string, int> retried;
  std::mutex mutex;
};

// Runs `view` as replica `name` to step kLast and records how far it got. One that dies
// (throws DiedMidStep: its ring closes with it) leaves the quorum, as its agent's report
// of the exit makes it.
void RunModel(InProcessQuorum& quorum, Replicas& replicas, const std::string& name, ElasticModel view) {
  RingListener listener;
  InProcessQuorum::Link link(quorum, name, listener.port());
  ElasticReplica replica(listener, link, std::move(view), RingOptions{5, "the job's secret"});
  try {
    const int64_t last = replica.RunUntil(0, kLast);
    std::lock_guard<std::mutex> lock(replicas.mutex);
    replicas.reached[name] = last;
    replicas.retried[name] = replica.retried();
  } catch (const DiedMidStep&) {
    quorum.Remove(name);
  }
}

// Runs replica `name` to step kLast; one with `die_at` dies computing that step.
void RunReplica(InProcessQuorum& quorum, Replicas& replicas, const std::string& name, int64_t die_at) {
  ElasticModel view = replicas.models.at(name).View();
  if (die_at > 0) {
    const auto accumulate = view.accumulate;
    view.accumulate = [accumulate, die_at](int64_t step, int position, int members, std::vector<float>* sum) {
      if (step == die_at) throw DiedMidStep{};
      accumulate(step, position, members, sum);
    };
  }
  RunModel(quorum, replicas, name, std::move(view));
}

// The weights of a run without failures, in fp64: 1 - lr times the sum over the steps
// of each global batch's mean gradient. Each step's float sum of 24 gradients of at
// most 1e-2, its scaling and the update round at about 2^-24 of 1 each: far below 1e-5
// over 20 steps.
void ExpectTheWeightsOfAnUnbrokenRun(const std::vector<float>& weights) {
  for (size_t j = 0; j < kWeights; j += 97) {
    double w = 1.0;
    for (int64_t step = 1; step <= kLast; ++step) {
      double sum = 0;
      for (int64_t x = 0; x < kBatch; ++x) sum += Gradient(step, x, j);
      w -= double(kLr) * (sum / kBatch);
    }
    EXPECT_NEAR(weights[j], w, 1e-5) << "weight " << j;
  }
}

// Three replicas, 20 steps. Replica c dies computing step 6; a and b fail that step,
// retry it as a quorum of two, and go on. A new replica d joins once step 10 has
// committed, is healed from a live peer at the next step boundary, and takes its share
// from then on.
// The quorum of the tests below: at least one replica, a 5 s timeout.
QuorumService::Options QuorumOf(int max_replicas) {
  QuorumService::Options options;
  options.min_replicas = 1;
  options.max_replicas = max_replicas;
  options.timeout_s = 5;
  options.join_window_s = 0.5;
  return options;
}

TEST(ElasticReplicaTest, SurvivorsRetryTheStepAndAJoinerIsHealedWithTheSameWeightsAsAnUnbrokenRun) {
  InProcessQuorum quorum(QuorumOf(3));
  Replicas r;
  for (const char* name : {"a", "b", "c"}) r.models[name];
  r.models["d"].weights.assign(kWeights, -7.0f);  // a fresh process's state, to be replaced by a heal
  std::vector<std::thread> threads;
  for (const auto& [name, die_at] : std::vector<std::pair<std::string, int64_t>>{{"a", 0}, {"b", 0}, {"c", 6}})
    threads.emplace_back(RunReplica, std::ref(quorum), std::ref(r), name, die_at);
  const double deadline = SteadySeconds() + 60;
  while (quorum.CommittedSteps() < 10 && SteadySeconds() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  threads.emplace_back(RunReplica, std::ref(quorum), std::ref(r), "d", 0);
  for (auto& t : threads) t.join();

  for (const char* name : {"a", "b", "d"}) {
    ASSERT_EQ(r.reached[name], kLast) << name;
    EXPECT_EQ(std::memcmp(r.models[name].weights.data(), r.models["a"].weights.data(), kWeights * sizeof(float)), 0)
        << name << "'s weights differ from a's";
  }
  ExpectTheWeightsOfAnUnbrokenRun(r.models["a"].weights);
  std::vector<int64_t> every(kLast);
  for (int64_t s = 1; s <= kLast; ++s) every[s - 1] = s;
  EXPECT_EQ(r.models["a"].applied, every) << "each step applied once, in order";
  EXPECT_EQ(r.models["c"].applied, std::vector<int64_t>({1, 2, 3, 4, 5}));
  ASSERT_FALSE(r.models["d"].applied.empty());
  EXPECT_GT(r.models["d"].applied.front(), 10);
  EXPECT_EQ(r.models["d"].applied.back(), kLast);
  EXPECT_GE(r.retried["a"], 1) << "step 6 failed with c gone";
}

// Which side of a heal dies in it: the live replica giving its state, or the joiner
// taking it.
enum class DiesHealing { kSource, kTarget };

// Runs replica `name` to step kLast; it dies in the first heal of a joiner after step 10
// that it takes part in as `side`, unless a replica died so first (`died` set already).
void RunReplicaDyingInAHeal(InProcessQuorum& quorum, Replicas& replicas, const std::string& name, DiesHealing side,
                            std::atomic<bool>& died) {
  ToyModel& model = replicas.models.at(name);
  ElasticModel view = model.View();
  if (side == DiesHealing::kSource) {
    const auto save = view.save;
    view.save = [save, &model, &died] {
      if (model.applied.size() >= 10 && !died.exchange(true)) throw DiedMidStep{};
      return save();
    };
  } else {
    const auto load = view.load;
    view.load = [load, &died](const std::vector<uint8_t>& bytes) {
      if (!died.exchange(true)) throw DiedMidStep{};
      load(bytes);
    };
  }
  RunModel(quorum, replicas, name, std::move(view));
}

// Three replicas a, b and c; once step 10 has committed, d joins (and, for a dying
// target, then e). The heal's source or target dies in it: the step fails on every
// member, is retried without the dead one, and the joiner still waiting is healed from
// a live replica. Every replica left ends with the weights of an unbroken run.
void ExpectAHealSurvivesADeathIn(DiesHealing side) {
  InProcessQuorum quorum(QuorumOf(4));
  Replicas r;
  std::atomic<bool> died{false};
  for (const char* name : {"a", "b", "c", "d", "e"}) r.models[name];
  r.models["d"].weights.assign(kWeights, -7.0f);  // fresh processes' states, to be replaced by heals
  r.models["e"].weights.assign(kWeights, -7.0f);
  std::atomic<bool> spent{true};  // for the replicas that do not die
  std::vector<std::thread> threads;
  for (const char* name : {"a", "b", "c"})
    threads.emplace_back(RunReplicaDyingInAHeal, std::ref(quorum), std::ref(r), name, DiesHealing::kSource,
                         std::ref(side == DiesHealing::kSource ? died : spent));
  const double deadline = SteadySeconds() + 60;
  while (quorum.CommittedSteps() < 10 && SteadySeconds() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  threads.emplace_back(RunReplicaDyingInAHeal, std::ref(quorum), std::ref(r), "d", DiesHealing::kTarget,
                       std::ref(side == DiesHealing::kTarget ? died : spent));
  if (side == DiesHealing::kTarget) {  // d dies in its heal: e replaces it
    while (!died && SteadySeconds() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    threads.emplace_back(RunReplicaDyingInAHeal, std::ref(quorum), std::ref(r), "e", DiesHealing::kTarget,
                         std::ref(died));
  }
  for (auto& t : threads) t.join();

  ASSERT_TRUE(died) << "a replica died in a heal";
  std::vector<std::string> finished;
  for (const auto& [name, last] : r.reached)
    if (last == kLast) finished.push_back(name);
  // kSource: two of a, b and c, and d; kTarget: a, b, c and e.
  ASSERT_EQ(finished.size(), side == DiesHealing::kSource ? 3u : 4u) << "every replica left took every step";
  for (const std::string& name : finished) {
    EXPECT_EQ(
        std::memcmp(r.models[name].weights.data(), r.models[finished[0]].weights.data(), kWeights * sizeof(float)), 0)
        << name << "'s weights differ from " << finished[0] << "'s";
  }
  ExpectTheWeightsOfAnUnbrokenRun(r.models[finished[0]].weights);
  const std::string joiner = side == DiesHealing::kSource ? "d" : "e";
  EXPECT_EQ(r.reached[joiner], kLast) << "the joiner was healed from a live replica after all";
  EXPECT_GE(r.retried[finished[0]], 1) << "the step of the heal failed";
}

TEST(ElasticReplicaTest, ALiveReplicaDyingWhileItHealsAJoinerFailsTheStepAndAnotherHealsIt) {
  ExpectAHealSurvivesADeathIn(DiesHealing::kSource);
}

TEST(ElasticReplicaTest, AJoinerDyingInItsHealFailsTheStepAndTheOthersGoOnAndHealTheNext) {
  ExpectAHealSurvivesADeathIn(DiesHealing::kTarget);
}

// A heal whose state is over the cap fails the step on every member, naming the cap,
// without allocating it; failing on each retry, it ends the steps.
TEST(ElasticReplicaTest, AHealOverTheStateCapFailsTheStepOnEveryMemberWithoutAllocatingIt) {
  QuorumService::Options options;
  options.min_replicas = 2;
  options.max_replicas = 2;
  options.timeout_s = 5;
  InProcessQuorum quorum(options);
  Replicas r;
  std::map<std::string, std::string> failures;
  std::vector<std::thread> threads;
  for (const std::string name : {"a", "b"}) {
    r.models[name];
    threads.emplace_back([&, name] {
      RingListener listener;
      InProcessQuorum::Link link(quorum, name, listener.port());
      ElasticModel view = r.models.at(name).View();
      view.max_state_bytes = kWeights * sizeof(float) - 1;  // step 1 heals b from a: one byte too many
      ElasticReplica replica(listener, link, view, RingOptions{5, "the job's secret"});
      const int64_t last = replica.RunUntil(0, kLast);
      std::lock_guard<std::mutex> lock(r.mutex);
      r.reached[name] = last;
      r.retried[name] = replica.retried();
      failures[name] = replica.last_failure();
    });
  }
  for (auto& t : threads) t.join();
  for (const char* name : {"a", "b"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(r.reached[name], 0) << "no step committed";
    EXPECT_EQ(r.retried[name], QuorumService::kMaxRetries);
    EXPECT_EQ(failures[name], "the state to heal member 1 from member 0 is 16384 bytes, over the cap of 16383");
    EXPECT_TRUE(r.models[name].applied.empty());
  }
  EXPECT_TRUE(quorum.GivenUp());
}

}  // namespace
}  // namespace trainyard
