// The metadata of a training checkpoint (worker/train/checkpoint.h): where the loop
// stood, the optimizer's and loss scaler's scalars and which RNG states the file holds,
// as the string map a safetensors header carries. Torch-free, so that the parse of an
// untrusted file's header and metadata can be fuzzed without libtorch.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

namespace trainyard {

// A checkpoint that cannot be used; what() names the file and the problem.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Version 2 added the data checksum and one RNG state per rank; version 1 files are
// refused (their other ranks' RNG states are lost, so they cannot resume exactly).
inline constexpr char kCheckpointFormat[] = "trainyard-checkpoint-2";

// Where the training loop stands. A checkpoint taken after step k of epoch e resumes
// at next_batch of epoch e with the same sums, so the epoch's row comes out the same.
struct TrainProgress {
  int64_t epoch = 0;          // 0-based epoch in progress
  int64_t next_batch = 0;     // index into that epoch's plan
  int64_t global_step = 0;    // steps taken, skipped ones included
  double epoch_loss_sum = 0;  // sum over the epoch's examples so far
  int64_t epoch_examples = 0, epoch_steps = 0, epoch_skipped = 0;
  // The evaluations judged so far (Trainer::Judge): the newest one's step, and under
  // checkpoint.best_metric the best one's step (0: none yet) and value, and the
  // evaluations since that did not better the best by train.early_stopping.threshold.
  // Carried from epoch to epoch; absent from a checkpoint, all zero.
  struct Evaluations {
    int64_t step = 0, best_step = 0, without_gain = 0;
    double best_value = 0;
  } evals;
  // An elastic run's quorum sizes (Note [Step quorum] in coordinator/quorum_service.h)
  // over the epoch's steps so far, how often the size changed from one step to the
  // next, and the last step's size (carried from epoch to epoch). All zero elsewhere,
  // and absent from such a checkpoint.
  struct Membership {
    int64_t min = 0, max = 0, changes = 0, last = 0;
  } replicas;
};

// Counts a step taken by a quorum of `size` replicas in `m`.
void NoteQuorumSize(TrainProgress::Membership& m, int64_t size);

struct CheckpointMeta {
  TrainProgress progress;
  int64_t optimizer_steps = 0;       // AdamW steps taken (bias correction)
  double loss_scale = 1.0;           // GradScaler scale (a float)
  int64_t scale_growth_tracker = 0;  // good steps since the scale last changed
  int64_t rng_ranks = 1;             // the file holds rng.cpu.<r> for r < rng_ranks
  bool cuda_rng = false;             // ... and rng.cuda.<r> too
};

// Upper bound of every step count in a checkpoint (the job file's bound, docs/job-file.md).
inline constexpr int64_t kMaxCheckpointSteps = 1'000'000'000'000;

// The metadata strings of `meta` (with the format), as SaveCheckpoint stores them.
std::map<std::string, std::string> CheckpointMetaStrings(const CheckpointMeta& meta);

// Parses and validates checkpoint metadata read from `path` (used in messages): the
// format, each field present and a plain decimal (or finite number) in its range, and
// the fields consistent with each other (next_batch <= global_step, ...). Throws
// CheckpointError "<path>: <field>: <problem>". Never reads the tensors.
CheckpointMeta ParseCheckpointMeta(const std::map<std::string, std::string>& meta, const std::string& path);

}  // namespace trainyard
