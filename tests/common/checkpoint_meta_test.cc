#include "common/checkpoint_meta.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/safetensors.h"

namespace trainyard {
namespace {

std::map<std::string, std::string> ValidMeta() {
  CheckpointMeta m;
  m.progress = TrainProgress{1, 5, 30, 12.5, 80, 5, 1, {25, 20, 1, 0.8125}, {2, 3, 2, 3}};
  m.optimizer_steps = 29;
  m.loss_scale = 32768.0;
  m.scale_growth_tracker = 3;
  m.rng_ranks = 2;
  m.cuda_rng = true;
  auto strings = CheckpointMetaStrings(m);
  strings[kDataChecksumKey] = "0123abcd";
  return strings;
}

// The CheckpointError of parsing `meta`, or "" if it parsed.
std::string ErrorOf(const std::map<std::string, std::string>& meta) {
  try {
    ParseCheckpointMeta(meta, "ck.safetensors");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointMeta, RoundTripsEveryField) {
  CheckpointMeta m = ParseCheckpointMeta(ValidMeta(), "ck.safetensors");
  EXPECT_EQ(m.progress.epoch, 1);
  EXPECT_EQ(m.progress.next_batch, 5);
  EXPECT_EQ(m.progress.global_step, 30);
  EXPECT_EQ(m.progress.epoch_loss_sum, 12.5);
  EXPECT_EQ(m.progress.epoch_examples, 80);
  EXPECT_EQ(m.progress.epoch_steps, 5);
  EXPECT_EQ(m.progress.epoch_skipped, 1);
  EXPECT_EQ(m.optimizer_steps, 29);
  EXPECT_EQ(m.loss_scale, 32768.0);
  EXPECT_EQ(m.scale_growth_tracker, 3);
  EXPECT_EQ(m.rng_ranks, 2);
  EXPECT_TRUE(m.cuda_rng);
  EXPECT_EQ(m.progress.evals.step, 25);
  EXPECT_EQ(m.progress.evals.best_step, 20);
  EXPECT_EQ(m.progress.evals.without_gain, 1);
  EXPECT_EQ(m.progress.evals.best_value, 0.8125);
  EXPECT_EQ(m.progress.replicas.min, 2);
  EXPECT_EQ(m.progress.replicas.max, 3);
  EXPECT_EQ(m.progress.replicas.changes, 2);
  EXPECT_EQ(m.progress.replicas.last, 3);
}

TEST(CheckpointMeta, OnlyAnElasticRunsCheckpointNamesItsQuorumSizes) {
  CheckpointMeta plain;
  EXPECT_EQ(CheckpointMetaStrings(plain).count("replicas_last"), 0u);
  std::map<std::string, std::string> meta = ValidMeta();
  for (const char* key : {"replicas_min", "replicas_max", "replica_changes", "replicas_last"}) meta.erase(key);
  EXPECT_EQ(ParseCheckpointMeta(meta, "ck.safetensors").progress.replicas.last, 0);
  meta = ValidMeta();
  meta["replicas_max"] = "1";  // below replicas_min
  EXPECT_NE(ErrorOf(meta).find("'replicas_max'"), std::string::npos) << ErrorOf(meta);
  meta = ValidMeta();
  meta["replicas_last"] = "0";
  EXPECT_NE(ErrorOf(meta).find("'replicas_last'"), std::string::npos) << ErrorOf(meta);
}

TEST(CheckpointMeta, AQuorumSizeChangeIsCountedBetweenStepsAndAcrossEpochs) {
  TrainProgress::Membership m;
  for (int64_t size : {3, 3, 2, 2, 3}) NoteQuorumSize(m, size);
  EXPECT_EQ(m.min, 2);
  EXPECT_EQ(m.max, 3);
  EXPECT_EQ(m.changes, 2);
  EXPECT_EQ(m.last, 3);
  TrainProgress::Membership next_epoch;
  next_epoch.last = m.last;
  NoteQuorumSize(next_epoch, 2);
  EXPECT_EQ(next_epoch.min, 2);
  EXPECT_EQ(next_epoch.changes, 1) << "the first step of an epoch against the last of the one before";
}

TEST(CheckpointMeta, ACheckpointWithoutEvaluationsHasNone) {
  std::map<std::string, std::string> meta = ValidMeta();
  for (const char* key : {"eval_step", "best_step", "evals_without_gain", "best_value"}) meta.erase(key);
  const CheckpointMeta m = ParseCheckpointMeta(meta, "ck");
  EXPECT_EQ(m.progress.evals.step, 0);
  EXPECT_EQ(m.progress.evals.best_step, 0);
  EXPECT_EQ(m.progress.evals.without_gain, 0);
}

TEST(CheckpointMeta, EvaluationsLieAtOrBeforeTheCheckpointsStep) {
  std::map<std::string, std::string> meta = ValidMeta();
  meta["eval_step"] = "31";
  EXPECT_EQ(ErrorOf(meta), "ck.safetensors: checkpoint metadata 'eval_step': exceeds global_step");
  meta = ValidMeta();
  meta["best_step"] = "26";
  EXPECT_EQ(ErrorOf(meta), "ck.safetensors: checkpoint metadata 'best_step': exceeds eval_step");
  meta = ValidMeta();
  meta.erase("best_value");
  EXPECT_EQ(ErrorOf(meta), "ck.safetensors: checkpoint metadata 'best_value': missing");
}

TEST(CheckpointMeta, LossSumIsStoredExactly) {
  std::map<std::string, std::string> meta = ValidMeta();
  CheckpointMeta m = ParseCheckpointMeta(meta, "ck");
  m.progress.epoch_loss_sum = 0.1 + 0.2;
  auto strings = CheckpointMetaStrings(m);
  strings[kDataChecksumKey] = "0123abcd";
  EXPECT_EQ(ParseCheckpointMeta(strings, "ck").progress.epoch_loss_sum, 0.1 + 0.2);
}

// Values that std::stoll accepted (leading spaces, trailing text), threw on untyped
// (overflow, empty) or that passed and crashed later (negative or absurd positions).
TEST(CheckpointMeta, EveryBadValueIsACheckpointErrorNamingFileAndField) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"global_step", "", "expected an integer, got ''"},
      {"global_step", " 30", "expected an integer, got ' 30'"},
      {"global_step", "30abc", "expected an integer, got '30abc'"},
      {"global_step", "+30", "expected an integer, got '+30'"},
      {"global_step", "99999999999999999999", "expected an integer, got '99999999999999999999'"},
      {"global_step", "-1", "expected an integer in [0, 1000000000000], got -1"},
      {"epoch", "9223372036854775807", "expected an integer in [0, 100000], got 9223372036854775807"},
      {"next_batch", "31", "exceeds global_step"},
      {"epoch_skipped", "6", "exceeds epoch_steps"},
      {"optimizer_steps", "31", "exceeds global_step"},
      {"loss_scale", "nan", "expected a finite number, got 'nan'"},
      {"loss_scale", "inf", "expected a finite number, got 'inf'"},
      {"loss_scale", "0", "expected a number in ["},
      {"loss_scale", "1e39", "expected a number in ["},
      {"loss_scale", "-2", "expected a number in ["},
      {"epoch_loss_sum", "-1", "expected a number in ["},
      {"rng_ranks", "0", "expected an integer in [1, 65536], got 0"},
      {"cuda_rng", "yes", "expected an integer, got 'yes'"},
      {"scale_growth_tracker", "-5", "expected an integer in [0, 1000000000], got -5"},
  };
  for (const auto& [key, value, problem] : cases) {
    auto meta = ValidMeta();
    meta[key] = value;
    EXPECT_EQ(ErrorOf(meta).rfind("ck.safetensors: checkpoint metadata '" + key + "': " + problem, 0), 0u)
        << key << "=" << value << ": " << ErrorOf(meta);
  }
}

TEST(CheckpointMeta, MissingFieldsAndOtherFormatsAreRefused) {
  for (const char* key :
       {"epoch", "next_batch", "global_step", "epoch_loss_sum", "epoch_examples", "epoch_steps", "epoch_skipped",
        "optimizer_steps", "loss_scale", "scale_growth_tracker", "rng_ranks", "cuda_rng", kDataChecksumKey}) {
    auto meta = ValidMeta();
    meta.erase(key);
    EXPECT_EQ(ErrorOf(meta), std::string("ck.safetensors: checkpoint metadata '") + key + "': missing");
  }
  auto meta = ValidMeta();
  meta["format"] = "trainyard-checkpoint-1";
  EXPECT_NE(ErrorOf(meta).find("'format': 'trainyard-checkpoint-1' is not trainyard-checkpoint-2"), std::string::npos)
      << ErrorOf(meta);
  meta.erase("format");
  EXPECT_EQ(ErrorOf(meta), "ck.safetensors: not a Trainyard checkpoint (no 'format' metadata)");
}

TEST(CheckpointMeta, DivergedLossSumIsKept) {
  auto meta = ValidMeta();
  meta["epoch_loss_sum"] = "nan";
  EXPECT_TRUE(std::isnan(ParseCheckpointMeta(meta, "ck").progress.epoch_loss_sum));
}

}  // namespace
}  // namespace trainyard
