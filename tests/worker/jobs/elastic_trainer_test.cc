// An elastic finetune (Note [Elastic finetune]): replicas of a real Trainer, each on a
// thread of its own with its own run folder, their rings over loopback TCP, and the
// coordinator's QuorumService reached in process. Three replicas train as one run of
// their global batch (Run's, one process with the whole batch); a replica lost mid-run
// costs the survivors a retried step, not a restart; a replica that joins is healed
// from a live one and ends with the same weights, bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/spec/job_spec.h"
#include "tests/worker/elastic/in_process_quorum.h"
#include "worker/elastic/tcp_ring.h"
#include "worker/jobs/trainer.h"
#include "worker/report/job_hooks.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr int kReplicas = 3;
constexpr int kBatchPerReplica = 4;
constexpr int kSteps = 8;  // 2 epochs of 46 examples in global batches of 12 (one of 10: uneven shards)

class ElasticTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_elastic_trainer_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::vector<std::string> en = {"the", "cat", "sat", "on", "a", "mat", "and", "dog"};
    const std::vector<std::string> fr = {"le", "chat", "assis", "sur", "un", "tapis", "et", "chien"};
    std::ofstream(dir_ / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n";
    for (const auto* words : {&en, &fr})
      for (const std::string& w : *words) std::ofstream(dir_ / "vocab.txt", std::ios::app) << w << "\n";
    std::mt19937 random(7);
    for (const auto& [file, count] : std::map<std::string, int>{{"train.tsv", 46}, {"dev.tsv", 16}}) {
      std::ofstream out(dir_ / file);
      out << "label\ttext\n";
      for (int i = 0; i < count; ++i) {
        const bool french = i % 2 == 1;
        const auto& words = french ? fr : en;
        out << (french ? "fr" : "en") << "\t";
        for (unsigned w = 0; w < 3 + random() % 6; ++w) out << (w ? " " : "") << words[random() % words.size()];
        out << "\n";
      }
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The job, its batch per rank `batch_size`, writing beneath runs/<runs>.
  JobSpec Spec(int batch_size, const std::string& runs) const {
    const std::string yaml =
        "name: elastic\ndata:\n  train: train.tsv\n  dev: dev.tsv\n  tokenizer:\n    vocab: vocab.txt\n"
        "model:\n  preset: tiny\n  dropout: 0\ntrain:\n  epochs: 2\n  batch_size: " +
        std::to_string(batch_size) +
        "\n  lr: 0.001\n  warmup_ratio: 0\nlog:\n  progress: false\n  steps_every: 1\n  runs_dir: " +
        (dir_ / "runs" / runs).string() + "\n";
    return ParseJobSpec(yaml, "elastic.yaml", dir_.string());
  }
  // Each step's loss in steps.jsonl beneath runs/<runs>, by step, with its replicas.
  std::map<int64_t, std::pair<double, int>> StepLosses(const std::string& runs) const {
    std::map<int64_t, std::pair<double, int>> losses;
    std::ifstream in(dir_ / "runs" / runs / "elastic" / "steps.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json step = nlohmann::json::parse(line);
      EXPECT_FALSE(losses.count(step["step"])) << "step " << step["step"] << " logged twice";
      losses[step["step"]] = {step["loss"], step.value("replicas", 0)};
    }
    return losses;
  }

  // Each step's loss of Run's job over the whole global batch in one process.
  std::map<int64_t, std::pair<double, int>> ReferenceLosses() const {
    torch::manual_seed(1234);  // the job's seed, as each process's job setup sets it
    Trainer reference(Spec(kBatchPerReplica * kReplicas, "reference"), RankContext{});
    reference.Run();
    return StepLosses("reference");
  }
  // The quorum: `min` replicas or more, kReplicas at most.
  static QuorumService::Options Policy(int min) {
    QuorumService::Options options;
    options.min_replicas = min;
    options.max_replicas = kReplicas;
    options.timeout_s = 30;
    options.join_window_s = 30;
    return options;
  }
  // A replica's Trainer, its parameters drawn from `seed` (each process's job setup seeds
  // its own generator; threads share one, so they are made in turn).
  std::unique_ptr<Trainer> Replica(const std::string& name, uint64_t seed, int64_t pause_ms = 0) const {
    RankContext ranks;
    ranks.elastic_replicas = kReplicas;
    JobSpec spec = Spec(kBatchPerReplica, name);
    spec.debug.step_pause_ms = pause_ms;
    torch::manual_seed(seed);
    return std::make_unique<Trainer>(std::move(spec), ranks);
  }

  fs::path dir_;
};

// A replica's trained parameters, flattened.
std::vector<float> Weights(Trainer& trainer) {
  std::vector<float> flat;
  for (const torch::Tensor& p : trainer.model().parameters()) {
    const torch::Tensor f = p.detach().to(torch::kFloat).contiguous().view({-1});
    flat.insert(flat.end(), f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  }
  return flat;
}

// What the replicas' threads came to.
struct Outcome {
  std::map<std::string, std::vector<float>> weights;
  std::map<std::string, std::string> failures;
  std::mutex mutex;
};

struct Died {};

// A link that dies (throws, as the process would end) when it is about to vote on
// step `die_at`, after computing its share: its ring closes under the others mid-step.
class MortalLink : public QuorumLink {
 public:
  explicit MortalLink(int64_t die_at) : die_at_(die_at) {}
  void Wrap(QuorumLink& link) { link_ = &link; }
  std::optional<QuorumView> Join(int64_t committed, const std::function<bool()>& stop) override {
    return link_->Join(committed, stop);
  }
  StepVerdict Vote(uint64_t id, int64_t step, bool ok, const std::string& why) override {
    if (step == die_at_) throw Died{};
    return link_->Vote(id, step, ok, why);
  }

 private:
  QuorumLink* link_ = nullptr;
  int64_t die_at_;
};

// A step's loss is the mean of its 12 examples' fp32 losses (near 0.7) in both runs,
// grouped differently (the shards' weighted means, or one mean): the sums' rounding is at
// most 11 x 2^-24 of 0.85, 6e-7, at equal weights, and the weights' own rounding
// differences through 8 updates of 1e-3 move the loss by far less (observed: at most
// 1.2e-7). 1e-5 holds that on any CPU's kernels and still catches a wrong shard, weight
// or learning rate (those move the loss by 1e-3 or more).
void ExpectTheReferenceLoss(double loss, double reference) { EXPECT_NEAR(loss, reference, 1e-5); }

// Runs `trainer` as replica `name` of `quorum` (through `link` if given), keeping its
// weights or its failure.
void RunReplica(InProcessQuorum& quorum, Trainer& trainer, const std::string& name, Outcome& outcome,
                QuorumLink* link = nullptr) {
  RingListener listener;
  InProcessQuorum::Link own(quorum, name, listener.port());
  MortalLink* mortal = dynamic_cast<MortalLink*>(link);
  if (mortal) mortal->Wrap(own);
  try {
    trainer.RunElastic({link ? link : &own, &listener, 30, "the job's secret"});
    std::lock_guard<std::mutex> lock(outcome.mutex);
    outcome.weights[name] = Weights(trainer);
  } catch (const Died&) {
    quorum.Remove(name);  // as its agent reports the process's end
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(outcome.mutex);
    outcome.failures[name] = e.what();
  }
}

TEST_F(ElasticTrainerTest, ThreeReplicasTrainAsOneRunOfTheirGlobalBatch) {
  const auto expected = ReferenceLosses();
  ASSERT_EQ(expected.size(), size_t(kSteps));

  InProcessQuorum quorum(Policy(1));
  Outcome outcome;
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const char* name : {"a", "b", "c"})
    trainers.push_back(
        Replica(name, std::string(name) == "a" ? 1234 : 99));  // b, c drew other weights: step 1 heals them
  for (int i = 0; i < kReplicas; ++i)
    threads.emplace_back([&, i] { RunReplica(quorum, *trainers[i], std::string(1, char('a' + i)), outcome); });
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(outcome.failures.empty()) << outcome.failures.begin()->second;
  EXPECT_EQ(outcome.weights["a"], outcome.weights["b"]) << "every replica applies the same summed gradients";
  EXPECT_EQ(outcome.weights["a"], outcome.weights["c"]);
  const auto losses = StepLosses("a");
  ASSERT_EQ(losses.size(), size_t(kSteps));
  for (const auto& [step, loss] : losses) {
    SCOPED_TRACE(step);
    EXPECT_EQ(loss.second, kReplicas);
    ExpectTheReferenceLoss(loss.first, expected.at(step).first);
  }
}

// Replica c dies after its share of step 3, before voting: a and b retry the step as a
// quorum of two, with no restart and no checkpoint, and go on. Replica d, a new process,
// joins once step 3 has committed: it is healed from a live replica at the next step
// boundary, takes its share from then on, and ends with the others' weights, bit for
// bit. Every step is in the survivors' steps.jsonl once, and every loss is the
// uninterrupted run's: the global batch never changed.
TEST_F(ElasticTrainerTest, AReplicaLostMidStepCostsARetryAndAJoinerIsHealedFromALivePeer) {
  const auto expected = ReferenceLosses();

  InProcessQuorum quorum(Policy(2));
  Outcome outcome;
  constexpr int64_t kPauseMs = 250;  // a step at least this long: d joins with steps to spare
  std::unique_ptr<Trainer> a = Replica("a", 1234, kPauseMs), b = Replica("b", 1234, kPauseMs),
                           c = Replica("c", 1234, kPauseMs), d = Replica("d", 77, kPauseMs);
  MortalLink dies_at_3(3);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { RunReplica(quorum, *a, "a", outcome); });
  threads.emplace_back([&] { RunReplica(quorum, *b, "b", outcome); });
  threads.emplace_back([&] { RunReplica(quorum, *c, "c", outcome, &dies_at_3); });
  threads.emplace_back([&] {
    while (quorum.CommittedSteps() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    RunReplica(quorum, *d, "d", outcome);
  });
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(outcome.failures.empty()) << outcome.failures.begin()->first << ": " << outcome.failures.begin()->second;
  ASSERT_EQ(outcome.weights.size(), 3u) << "a, b and d finished; c died";
  EXPECT_EQ(outcome.weights["a"], outcome.weights["b"]);
  EXPECT_EQ(outcome.weights["a"], outcome.weights["d"]) << "the healed joiner's weights are the others', bit for bit";
  const auto losses = StepLosses("a");
  ASSERT_EQ(losses.size(), size_t(kSteps)) << "every step once: the retried one too";
  EXPECT_EQ(losses.at(1).second, 3);
  EXPECT_EQ(losses.at(3).second, 2) << "step 3 retried by the two left";
  EXPECT_EQ(losses.at(kSteps).second, 3) << "d took its share at the end";
  for (const auto& [step, loss] : losses) {
    SCOPED_TRACE(step);
    ExpectTheReferenceLoss(loss.first, expected.at(step).first);
  }
  const auto joined = StepLosses("d");
  ASSERT_FALSE(joined.empty());
  EXPECT_GT(joined.begin()->first, 3) << "d's first step is after its heal";
  EXPECT_EQ(joined.rbegin()->first, kSteps);
}

// A pool's stop, asked of every replica at once (a preemption): each leaves its quorum
// between steps, writes a checkpoint where it stopped, and ends as preempted; none takes
// a step the others did not commit.
class PreemptAfter : public JobHooks {
 public:
  PreemptAfter(InProcessQuorum& quorum, int64_t step) : quorum_(quorum), step_(step) {}
  void EpochDone(const EpochRow&, const std::string&, const std::string&) override {}
  bool StopRequested() const override { return quorum_.CommittedSteps() >= step_; }
  bool PreemptRequested() const override { return StopRequested(); }

 private:
  InProcessQuorum& quorum_;
  int64_t step_;
};

TEST_F(ElasticTrainerTest, APreemptionStopsEveryReplicaBetweenStepsWithACheckpoint) {
  InProcessQuorum quorum(Policy(1));
  PreemptAfter hooks(quorum, 3);
  Outcome outcome;
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const char* name : {"a", "b", "c"}) {
    RankContext ranks;
    ranks.elastic_replicas = kReplicas;
    ranks.hooks = &hooks;
    JobSpec spec = Spec(kBatchPerReplica, name);
    spec.debug.step_pause_ms = 100;
    torch::manual_seed(1234);
    trainers.push_back(std::make_unique<Trainer>(std::move(spec), ranks));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kReplicas; ++i)
    threads.emplace_back([&, i] { RunReplica(quorum, *trainers[i], std::string(1, char('a' + i)), outcome); });
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(outcome.failures.size(), 3u) << "every replica stopped";
  const int64_t committed = quorum.CommittedSteps();
  EXPECT_GE(committed, 3);
  EXPECT_LT(committed, kSteps);
  for (const auto& [name, why] : outcome.failures) {
    SCOPED_TRACE(name);
    EXPECT_NE(why.find("(a preemption); checkpoint of step"), std::string::npos) << why;
    const auto steps = StepLosses(name);
    ASSERT_FALSE(steps.empty());
    EXPECT_LE(steps.rbegin()->first, committed) << "no step past the committed ones";
    const fs::path checkpoint = dir_ / "runs" / name / "elastic" / "checkpoints" /
                                StrFormat("step-%09ld.safetensors", long(steps.rbegin()->first));
    EXPECT_TRUE(fs::exists(checkpoint)) << checkpoint;
  }
}

}  // namespace
}  // namespace trainyard
