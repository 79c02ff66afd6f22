// Training checkpoints: one safetensors file per checkpoint holding the model's trained
// parameters ("model.*": those with requires_grad, so under LoRA only the adapters and
// saved modules; the frozen base comes from model.init again), the AdamW moments ("optim.*") and every rank's RNG
// states ("rng.cpu.<r>", and "rng.cuda.<r>" for the rank's GPU when the job trains on CUDA), with the loop position,
// loss scaler and partial-epoch sums in its metadata (common/checkpoint_meta.h) and a CRC32C of all tensor data
// (common/safetensors.h). Files are written atomically (temp, fsync, rename), so a crash leaves the previous checkpoint
// intact; a truncated, corrupted or inconsistent file fails validation and is never loaded.
//
// Note [Resume]
// A job resumes (checkpoint.resume: auto or a file; a pool's later attempts always use
// auto) so that the finished run is the one an uninterrupted run would have been:
//   1. At the end of every epoch (and every_steps), after the step's sums have been read
//      from the device, every rank hands its RNG states to rank 0 (an all-gather, part
//      of the step's collectives), and rank 0 writes one checkpoint holding all of them.
//      Only then is the epoch row final and reported to a pool (JobHooks::EpochDone), so
//      a reported epoch is never redone. One file rather than a side file per rank: a
//      checkpoint is then complete or absent, never half of one, and pruning and
//      fallback deal in whole checkpoints.
//   2. Each rank picks the checkpoint itself (Trainer::ResolveResume): with `auto`, the
//      newest that passes every check (checksum, metadata, tensor names, shapes and
//      dtypes, RNG state sizes, its position inside this job's epoch plan). Each
//      rejected newer file is logged with the reason and, once the ranks agree, renamed
//      <file>.rejected so that it is never counted by checkpoint.keep nor tried again.
//      If checkpoints exist but none is valid, the job fails with exit 2 and deletes
//      nothing; an explicit `resume: <file>` that is invalid fails the same way. The
//      ranks then agree on the step they resume at (Trainer::AgreeOnResumePoint).
//   3. Rank r restores rng.cpu.<r> (and rng.cuda.<r>), so dropout masks continue as
//      they would have. With another number of ranks the run cannot be the same anyway
//      (each rank gets another shard of every global batch): rank r then takes
//      rng.cpu.<r> if the file has it and rank 0's state otherwise, as a fresh run
//      starts every rank from the same seed.
//   4. The sampler's plan for an epoch is a pure function of (seed, epoch), so skipping
//      the epoch's first next_batch batches restores the data order exactly, and the
//      partial-epoch sums restore that epoch's row.
//   5. RunLog drops the rows and step lines at or after the resume point from the
//      files, and a pool's coordinator drops epoch reports it already has, so every
//      epoch and step appears exactly once.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_meta.h"
#include "worker/train/amp.h"
#include "worker/train/optimizer.h"

namespace trainyard {

// One rank's generator states as a checkpoint holds them (uint8 tensors on the CPU);
// `cuda` is undefined when the model is not on a GPU.
struct RngState {
  torch::Tensor cpu, cuda;
};

// This process's states: the CPU generator's and that of the GPU `model` lives on.
RngState CaptureRngState(torch::nn::Module& model);

std::string CheckpointPath(const std::string& dir, int64_t global_step);

// Writes a checkpoint; rng_by_rank[r] is rank r's RngState (all ranks alike in which
// states they have).
void SaveCheckpoint(const std::string& path, torch::nn::Module& model, const AdamW& optimizer, const GradScaler& scaler,
                    const TrainProgress& progress, const std::vector<RngState>& rng_by_rank);

// What a loaded checkpoint told about itself beyond the progress.
struct LoadedCheckpoint {
  TrainProgress progress;
  int64_t rng_ranks = 1;  // ranks whose RNG states the file holds
};

// Validates everything in the file first, then restores the model, optimizer, scaler
// and this rank's RNG states, so a file that fails leaves them untouched. The loop
// position must lie inside this job's plan of `steps_per_epoch` batches. Throws
// CheckpointError naming the file and the problem.
LoadedCheckpoint LoadCheckpoint(const std::string& path, torch::nn::Module& model, AdamW& optimizer, GradScaler& scaler,
                                int rank, int64_t steps_per_epoch);

// Checkpoints in `dir`, newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);
// Deletes all but the newest `keep` checkpoints and that of step `also_keep` (the best
// evaluation's, under checkpoint.best_metric; 0: none).
void PruneCheckpoints(const std::string& dir, int keep, int64_t also_keep = 0);
// Deletes every checkpoint in `dir` (and a crashed write's leftovers of one), for a
// fresh run: files of other names, and folders, are left where they are.
void RemoveCheckpoints(const std::string& dir);

}  // namespace trainyard
