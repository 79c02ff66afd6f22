// Training checkpoints: one safetensors file per checkpoint holding the model
// ("model.*"), the AdamW moments ("optim.*") and the RNG states ("rng.*"), with the
// loop position, loss scaler and partial-epoch sums in its metadata. Files are written
// atomically (temp, fsync, rename), so a crash leaves the previous checkpoint intact;
// a truncated file fails validation and is never loaded.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/amp.h"
#include "worker/models/bert.h"
#include "worker/optimizer.h"

namespace trainyard {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where the training loop stands. A checkpoint taken after step k of epoch e resumes
// at next_batch of epoch e with the same sums, so the epoch's row comes out the same.
struct TrainProgress {
  int64_t epoch = 0;          // 0-based epoch in progress
  int64_t next_batch = 0;     // index into that epoch's plan
  int64_t global_step = 0;    // steps taken, skipped ones included
  double epoch_loss_sum = 0;  // sum over the epoch's examples so far
  int64_t epoch_examples = 0, epoch_steps = 0, epoch_skipped = 0;
};

std::string CheckpointPath(const std::string& dir, int64_t global_step);

void SaveCheckpoint(const std::string& path, BertForSequenceClassification& model,
                    const AdamW& optimizer, const GradScaler& scaler, const TrainProgress& progress);

// Restores everything SaveCheckpoint saved. Throws CheckpointError naming the file and
// the problem (truncated, wrong model shape, missing state).
TrainProgress LoadCheckpoint(const std::string& path, BertForSequenceClassification& model,
                             AdamW& optimizer, GradScaler& scaler);

// Checkpoints in `dir`, newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);
// The newest checkpoint that passes validation; invalid ones are reported in *rejected.
std::optional<std::string> LatestValidCheckpoint(const std::string& dir,
                                                 std::vector<std::string>* rejected);
// Deletes all but the newest `keep` checkpoints.
void PruneCheckpoints(const std::string& dir, int keep);

}  // namespace trainyard
