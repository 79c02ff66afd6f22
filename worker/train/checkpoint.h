// Training checkpoints: one safetensors file per checkpoint holding the model
// ("model.*"), the AdamW moments ("optim.*") and the RNG states ("rng.cpu", and
// "rng.cuda" for the model's GPU when it trains on one), with the loop position, loss
// scaler and partial-epoch sums in its metadata. Files are written atomically (temp,
// fsync, rename), so a crash leaves the previous checkpoint intact; a truncated file
// fails validation and is never loaded. A CUDA RNG state is restored only when the
// resumed job runs on CUDA too.
//
// Note [Resume]
// A job resumes (checkpoint.resume: auto or a file; a pool's later attempts always use
// auto) so that the finished run is the one an uninterrupted run would have been:
//   1. Rank 0 writes a checkpoint at the end of every epoch (and every_steps), after the
//      step's sums have been read from the device; only then is the epoch row final and
//      reported to a pool (JobHooks::EpochDone), so a reported epoch is never redone.
//   2. Each rank loads the same file (Trainer::ResolveResume); the ranks then agree on
//      the step they resume at (Trainer::AgreeOnResumePoint) before any training.
//   3. The sampler's plan for an epoch is a pure function of (seed, epoch), so skipping
//      the epoch's first next_batch batches restores the data order exactly, and the
//      partial-epoch sums restore that epoch's row.
//   4. RunLog drops the rows and step lines at or after the resume point from the
//      files, and a pool's coordinator drops epoch reports it already has, so every
//      epoch and step appears exactly once.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/models/bert.h"
#include "worker/train/amp.h"
#include "worker/train/optimizer.h"

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

void SaveCheckpoint(const std::string& path, BertForSequenceClassification& model, const AdamW& optimizer,
                    const GradScaler& scaler, const TrainProgress& progress);

// Restores everything SaveCheckpoint saved. Throws CheckpointError naming the file and
// the problem (truncated, wrong model shape, missing state).
TrainProgress LoadCheckpoint(const std::string& path, BertForSequenceClassification& model, AdamW& optimizer,
                             GradScaler& scaler);

// Checkpoints in `dir`, newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);
// The newest checkpoint that passes validation; invalid ones are reported in *rejected.
std::optional<std::string> LatestValidCheckpoint(const std::string& dir, std::vector<std::string>* rejected);
// Deletes all but the newest `keep` checkpoints.
void PruneCheckpoints(const std::string& dir, int keep);

}  // namespace trainyard
