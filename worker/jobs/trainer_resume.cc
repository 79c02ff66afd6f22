// The Trainer's checkpoints and resume (Note [Resume] in worker/train/checkpoint.h;
// Note [Node-local checkpoints] in checkpoint_sharing.h): which checkpoint each rank
// resumes from, the RNG states every checkpoint carries, and saving.
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "worker/jobs/trainer.h"

namespace trainyard {

void Trainer::SettleCheckpoints() {
  const std::string dir = run_dir() + "/checkpoints";
  writers_ = DecideCheckpointWriters(*ranks_.comm, dir);
  if (spec_.checkpoint.resume == "none") return;
  const LocalResume mine{resume_from_ ? progress_.global_step : -1, !rejected_.empty()};
  const SharedResume shared = ShareNewestCheckpoint(*ranks_.comm, *writers_, dir, mine);
  if (shared.only_rejected) throw NoValidCheckpoint(rejected_.size());
  if (shared.load) {
    try {
      LoadResumeCheckpoint(*shared.load);
    } catch (const CheckpointError& e) {
      throw std::runtime_error(std::string("resume: the checkpoint another host sent does not load: ") + e.what());
    }
  }
}

void Trainer::AgreeOnResumePoint() {
  auto steps = ranks_.comm->AllGather({double(progress_.global_step)}, "resume point");
  for (int r = 0; r < ranks_.world; ++r)
    if (steps[r][0] != steps[0][0])
      throw std::runtime_error(StrFormat("ranks disagree on the resume point: rank 0 at step %.0f, rank %d at %.0f",
                                         steps[0][0], r, steps[r][0]));
}

// Note [Resume] 2: the newest checkpoint that loads, or exit 2 when there are some and
// none does (an explicit file must load). LoadCheckpoint changes nothing when it throws.
void Trainer::ResolveResume() {
  const std::string& resume = spec_.checkpoint.resume;
  if (resume == "none") return;
  const bool automatic = resume == "auto";
  const std::string dir = run_dir() + "/checkpoints";
  const std::vector<std::string> candidates = automatic ? ListCheckpoints(dir) : std::vector<std::string>{resume};
  for (const auto& path : candidates) {
    try {
      LoadResumeCheckpoint(path);
      return;
    } catch (const CheckpointError& e) {
      if (!automatic) throw InputError(spec_.Where("checkpoint.resume") + ": " + e.what());
      if (!ranks_.comm || ranks_.comm->FirstRankOnHost(ranks_.rank) == ranks_.rank)
        LogWarn(std::string("resume: rejected ") + e.what());
      rejected_.push_back(path);
    }
  }
  // With several ranks, another host may hold a valid one (SettleCheckpoints).
  if (!rejected_.empty() && !ranks_.comm) throw NoValidCheckpoint(rejected_.size());
}

void Trainer::LoadResumeCheckpoint(const std::string& path) {
  const LoadedCheckpoint loaded = LoadCheckpoint(path, *model_, *optimizer_, *scaler_, ranks_.rank, steps_per_epoch_);
  progress_ = loaded.progress;
  resume_from_ = path;
  if (loaded.rng_ranks != ranks_.world && is_rank0())
    LogWarn(
        StrFormat("resume: %s holds the RNG states of %ld ranks, this job has %d: ranks without one start "
                  "from rank 0's, and the run will not be bitwise the one an uninterrupted run makes",
                  path.c_str(), long(loaded.rng_ranks), ranks_.world));
}

InputError Trainer::NoValidCheckpoint(size_t rejected) const {
  return InputError(spec_.Where("checkpoint.resume") + ": none of the " + std::to_string(rejected) +
                    " checkpoints in " + run_dir() + "/checkpoints" + (ranks_.comm ? " on any host" : "") +
                    " is valid (see the warnings above); starting over would delete them, so the job stops. "
                    "Move them away or set checkpoint.resume: none to train from the start");
}

void Trainer::SetAsideRejected() {
  for (const auto& path : rejected_) {
    std::error_code error;
    const std::string aside = path + ".rejected";
    std::filesystem::rename(path, aside, error);
    if (error)
      LogWarn("resume: could not rename rejected " + path + ": " + error.message());
    else
      LogWarn("resume: kept the rejected checkpoint as " + aside);
  }
}

// Every rank's RngState, on every rank (Note [Resume] 1): the CPU state's bytes, then
// the GPU's, gathered as bytes.
std::vector<RngState> Trainer::GatherRngStates() {
  RngState mine = CaptureRngState(*model_);
  if (!ranks_.comm) return {mine};
  const int64_t cpu_bytes = mine.cpu.numel(), cuda_bytes = mine.cuda.defined() ? mine.cuda.numel() : 0;
  std::vector<uint8_t> bytes(static_cast<size_t>(cpu_bytes + cuda_bytes));
  std::memcpy(bytes.data(), mine.cpu.data_ptr(), static_cast<size_t>(cpu_bytes));
  if (cuda_bytes) std::memcpy(bytes.data() + cpu_bytes, mine.cuda.data_ptr(), static_cast<size_t>(cuda_bytes));
  auto all = ranks_.comm->AllGatherBytes(bytes, StrFormat("RNG states at step %ld", long(progress_.global_step)));
  std::vector<RngState> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    out[r].cpu = torch::from_blob(all[r].data(), {cpu_bytes}, torch::kByte).clone();
    if (cuda_bytes) out[r].cuda = torch::from_blob(all[r].data() + cpu_bytes, {cuda_bytes}, torch::kByte).clone();
  }
  return out;
}

void Trainer::SaveCheckpointNow(const std::string& reason) {
  const std::vector<RngState> rng = GatherRngStates();
  if (!WritesCheckpoints()) return;
  const std::string dir = run_dir() + "/checkpoints";
  SaveCheckpoint(CheckpointPath(dir, progress_.global_step), *model_, *optimizer_, *scaler_, progress_, rng);
  PruneCheckpoints(dir, spec_.checkpoint.keep, spec_.checkpoint.best_metric.empty() ? 0 : progress_.evals.best_step);
  LogDebug(StrFormat("checkpoint at step %ld (%s)", long(progress_.global_step), reason.c_str()));
}

void Trainer::PrepareCheckpointFolder() {
  SetAsideRejected();
  // A fresh run must not leave an older run's checkpoints next to its own: they would
  // outrank the new ones in pruning and in `resume: auto`. Only those go.
  if (!resume_from_) RemoveCheckpoints(run_dir() + "/checkpoints");
}

}  // namespace trainyard
