// Training checkpoints in-process (worker/train/checkpoint.h): what a checkpoint restores,
// and that a file that fails any check restores nothing. The end-to-end resume tests
// (tests/worker/resume_test.py) prove a resumed job ends bitwise equal to an
// uninterrupted one; these pin the pieces they rest on.
#include "worker/train/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint_meta.h"
#include "common/spec/job_spec.h"
#include "tests/common/scratch_dir.h"
#include "worker/train/amp.h"
#include "worker/train/optimizer.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

// A model with a trainable matrix and bias and a frozen table, which a checkpoint leaves
// out (it comes from model.init again).
struct Net : torch::nn::Module {
  Net() {
    linear = register_module("linear", torch::nn::Linear(6, 4));
    frozen = register_parameter("frozen", torch::randn({3, 4}), /*requires_grad=*/false);
  }
  torch::nn::Linear linear{nullptr};
  torch::Tensor frozen;
};

std::vector<std::pair<std::string, torch::Tensor>> Trainable(Net& net) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : net.named_parameters())
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  return out;
}

// A model, its optimizer after `steps` updates, and a scaler: what a trainer holds.
struct Trained {
  explicit Trained(uint64_t seed, int steps = 3) : scaler(LossScaleSpec{}, /*enabled=*/true) {
    torch::manual_seed(seed);
    net = std::make_shared<Net>();
    optimizer = std::make_unique<AdamW>(Trainable(*net), AdamWOptions{});
    for (int i = 0; i < steps; ++i) {
      optimizer->ZeroGrad();
      net->linear->forward(torch::randn({5, 6})).pow(2).sum().backward();
      optimizer->Step(1e-2);
    }
  }
  std::shared_ptr<Net> net;
  std::unique_ptr<AdamW> optimizer;
  GradScaler scaler;
};

TrainProgress Progress() {
  TrainProgress p;
  p.epoch = 1;
  p.next_batch = 4;
  p.global_step = 14;
  p.epoch_loss_sum = 12.5;
  p.epoch_examples = 64;
  p.epoch_steps = 4;
  return p;
}

bool SameTensors(const std::vector<std::pair<std::string, torch::Tensor>>& a,
                 const std::vector<std::pair<std::string, torch::Tensor>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !torch::equal(a[i].second, b[i].second)) return false;
  return true;
}

class CheckpointTest : public ::testing::Test {
 protected:
  // A checkpoint of `from` at Progress(), holding the RNG states of two ranks: this
  // process's now, and rank 1's, taken after one more draw.
  std::string Save(Trained& from) {
    const std::string path = CheckpointPath(dir_.string(), Progress().global_step);
    RngState rank0 = CaptureRngState(*from.net);
    torch::rand({1});
    RngState rank1 = CaptureRngState(*from.net);
    SaveCheckpoint(path, *from.net, *from.optimizer, from.scaler, Progress(), {rank0, rank1});
    return path;
  }

  ScratchDir scratch_{"ty_checkpoint_test"};
  const fs::path dir_ = scratch_.path();
};

TEST_F(CheckpointTest, RestoresWeightsMomentsScalerProgressAndThisRanksRandomStream) {
  Trained saved(1);
  saved.scaler.Restore(1024.0f, 17);
  torch::manual_seed(99);
  const std::string path = Save(saved);
  // Rank 1's stream: the draws after the one Save() made between the two captures.
  const torch::Tensor rank1_next = torch::rand({4});

  Trained fresh(2, /*steps=*/1);
  const LoadedCheckpoint loaded = LoadCheckpoint(path, *fresh.net, *fresh.optimizer, fresh.scaler, /*rank=*/1,
                                                 /*steps_per_epoch=*/10);
  EXPECT_TRUE(SameTensors(Trainable(*fresh.net), Trainable(*saved.net)));
  EXPECT_FALSE(torch::equal(fresh.net->frozen, saved.net->frozen)) << "a frozen parameter was restored";
  EXPECT_TRUE(SameTensors(fresh.optimizer->StateTensors(), saved.optimizer->StateTensors()));
  EXPECT_EQ(fresh.optimizer->step_count(), 3);
  EXPECT_EQ(fresh.scaler.scale(), 1024.0f);
  EXPECT_EQ(fresh.scaler.growth_tracker(), 17);
  EXPECT_EQ(loaded.rng_ranks, 2);
  EXPECT_EQ(loaded.progress.epoch, 1);
  EXPECT_EQ(loaded.progress.next_batch, 4);
  EXPECT_EQ(loaded.progress.global_step, 14);
  EXPECT_EQ(loaded.progress.epoch_loss_sum, 12.5);
  EXPECT_EQ(loaded.progress.epoch_examples, 64);
  EXPECT_TRUE(torch::equal(torch::rand({4}), rank1_next)) << "rank 1 did not get its own generator state";
}

// Writes `bytes` over the file at `offset` from its end.
void Overwrite(const std::string& path, std::streamoff from_end, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-from_end, std::ios::end);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Every failed load leaves the model, the optimizer and the scaler as they were.
void ExpectRefusedAndUntouched(const std::string& path, int64_t steps_per_epoch, const std::string& reason) {
  Trained target(3, /*steps=*/2);
  const auto weights = Trainable(*target.net);
  std::vector<std::pair<std::string, torch::Tensor>> before_weights, before_state;
  for (const auto& [name, t] : weights) before_weights.emplace_back(name, t.clone());
  for (const auto& [name, t] : target.optimizer->StateTensors()) before_state.emplace_back(name, t.clone());
  const float scale = target.scaler.scale();
  try {
    LoadCheckpoint(path, *target.net, *target.optimizer, target.scaler, 0, steps_per_epoch);
    ADD_FAILURE() << "loaded: " << reason;
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
  EXPECT_TRUE(SameTensors(Trainable(*target.net), before_weights));
  EXPECT_TRUE(SameTensors(target.optimizer->StateTensors(), before_state));
  EXPECT_EQ(target.optimizer->step_count(), 2);
  EXPECT_EQ(target.scaler.scale(), scale);
}

TEST_F(CheckpointTest, AFlippedByteInTheTensorDataRestoresNothing) {
  Trained saved(1);
  const std::string path = Save(saved);
  std::string byte(1, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    in.seekg(-20, std::ios::end);
    in.read(byte.data(), 1);
  }
  byte[0] = char(byte[0] ^ 0x10);
  Overwrite(path, 20, byte);
  ExpectRefusedAndUntouched(path, 10, "checksum");
}

TEST_F(CheckpointTest, ATruncatedFileRestoresNothing) {
  Trained saved(1);
  const std::string path = Save(saved);
  fs::resize_file(path, fs::file_size(path) - 7);
  ExpectRefusedAndUntouched(path, 10, "");
}

TEST_F(CheckpointTest, APositionOutsideThisJobsEpochPlanRestoresNothing) {
  Trained saved(1);
  const std::string path = Save(saved);
  // Saved at batch 4 of an epoch; a job whose epochs have 3 batches cannot resume there.
  ExpectRefusedAndUntouched(path, 3, "next_batch");
}

TEST_F(CheckpointTest, AModelOfAnotherShapeRestoresNothing) {
  Trained saved(1);
  const std::string path = Save(saved);
  torch::manual_seed(4);
  struct Wider : torch::nn::Module {
    Wider() { linear = register_module("linear", torch::nn::Linear(6, 5)); }
    torch::nn::Linear linear{nullptr};
  } wider;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : wider.named_parameters()) params.emplace_back(item.key(), item.value());
  AdamW optimizer(params, AdamWOptions{});
  GradScaler scaler(LossScaleSpec{}, true);
  const torch::Tensor before = wider.linear->weight.clone();
  EXPECT_THROW(LoadCheckpoint(path, wider, optimizer, scaler, 0, 10), CheckpointError);
  EXPECT_TRUE(torch::equal(wider.linear->weight, before));
}

TEST_F(CheckpointTest, ListingIsNewestFirstPruningKeepsTheNewestAndTheBestRemovalSparesOtherFiles) {
  Trained saved(1);
  RngState rng = CaptureRngState(*saved.net);
  for (int64_t step : {5, 40, 300}) {
    TrainProgress p = Progress();
    p.global_step = step;
    p.next_batch = 1;
    SaveCheckpoint(CheckpointPath(dir_.string(), step), *saved.net, *saved.optimizer, saved.scaler, p, {rng});
  }
  // Nothing but the checkpoints is left of the writes (they go to a temporary name first).
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) files += entry.is_regular_file();
  EXPECT_EQ(files, 3);
  const std::vector<std::string> listed = ListCheckpoints(dir_.string());
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0], CheckpointPath(dir_.string(), 300));
  EXPECT_EQ(listed[2], CheckpointPath(dir_.string(), 5));

  // The best evaluation's checkpoint is kept beside the newest.
  PruneCheckpoints(dir_.string(), 1, /*also_keep=*/5);
  EXPECT_EQ(ListCheckpoints(dir_.string()),
            (std::vector<std::string>{CheckpointPath(dir_.string(), 300), CheckpointPath(dir_.string(), 5)}));
  PruneCheckpoints(dir_.string(), 2);
  EXPECT_EQ(ListCheckpoints(dir_.string()),
            (std::vector<std::string>{CheckpointPath(dir_.string(), 300), CheckpointPath(dir_.string(), 5)}));
  PruneCheckpoints(dir_.string(), 1);
  EXPECT_EQ(ListCheckpoints(dir_.string()), (std::vector<std::string>{CheckpointPath(dir_.string(), 300)}));

  std::ofstream(dir_ / "notes.txt") << "mine";
  fs::create_directories(dir_ / "keep_me");
  RemoveCheckpoints(dir_.string());
  EXPECT_TRUE(ListCheckpoints(dir_.string()).empty());
  EXPECT_TRUE(fs::exists(dir_ / "notes.txt"));
  EXPECT_TRUE(fs::is_directory(dir_ / "keep_me"));
}

}  // namespace
}  // namespace trainyard
