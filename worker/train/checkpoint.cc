#include "worker/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <filesystem>

#include "common/log.h"
#include "common/safetensors.h"
#include "worker/models/hf_checkpoint.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using TensorMap = std::map<std::string, torch::Tensor>;

torch::Tensor CpuRngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetCpuRngState(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The default generator of the GPU the model lives on; undefined on CPU.
at::Generator ModelCudaGenerator(torch::nn::Module& model) {
#ifdef TRAINYARD_WITH_CUDA
  const torch::Device device = model.parameters().front().device();
  if (device.is_cuda()) return at::cuda::detail::getDefaultCUDAGenerator(device.index());
#else
  (void)model;
#endif
  return at::Generator();
}

std::string Describe(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + c10::str(t.sizes());
}

// Why a tensor's dtype or shape may differ from this job's: a bf16 tensor where this job
// has fp32 (or the other way), at the same shape, is a linear weight of a job whose
// train.bf16_weights differs; anything else points to another model.
std::string MismatchHint(const torch::Tensor& found, const torch::Tensor& like) {
  const auto a = found.scalar_type(), b = like.scalar_type();
  const bool bf16_weights_differ = found.sizes() == like.sizes() && ((a == torch::kBFloat16 && b == torch::kFloat) ||
                                                                     (a == torch::kFloat && b == torch::kBFloat16));
  return bf16_weights_differ ? " (a checkpoint of a job whose train.bf16_weights differs?)"
                             : " (a checkpoint of another model?)";
}

// `tensors[name]`, which must have `like`'s dtype and shape.
const torch::Tensor& Expect(const TensorMap& tensors, const std::string& name, const torch::Tensor& like,
                            const std::string& path) {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw CheckpointError(path + ": tensor '" + name + "' is missing");
  if (it->second.scalar_type() != like.scalar_type() || it->second.sizes() != like.sizes())
    throw CheckpointError(path + ": tensor '" + name + "' is " + Describe(it->second) + ", this job's is " +
                          Describe(like) + MismatchHint(it->second, like));
  return it->second;
}

// Throws CheckpointError unless every tensor LoadCheckpoint will restore is in the file
// with the dtype and shape it replaces.
void CheckTensors(const TensorMap& tensors, const CheckpointMeta& meta, torch::nn::Module& model,
                  const AdamW& optimizer, const std::string& path) {
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) Expect(tensors, "model." + item.key(), item.value(), path);
  for (const auto& [name, t] : optimizer.StateTensors()) Expect(tensors, "optim." + name, t, path);
  const torch::Tensor cpu_now = CpuRngState();
  for (int64_t r = 0; r < meta.rng_ranks; ++r) Expect(tensors, "rng.cpu." + std::to_string(r), cpu_now, path);
  if (at::Generator gen = ModelCudaGenerator(model); gen.defined() && meta.cuda_rng) {
    torch::Tensor cuda_now;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      cuda_now = gen.get_state();
    }
    for (int64_t r = 0; r < meta.rng_ranks; ++r) Expect(tensors, "rng.cuda." + std::to_string(r), cuda_now, path);
  }
}

// Rank `rank`'s states, or rank 0's where the file has fewer ranks (Note [Resume] 3).
void RestoreRng(const TensorMap& tensors, const CheckpointMeta& meta, torch::nn::Module& model, int rank,
                const std::string& path) {
  const std::string source = std::to_string(rank < meta.rng_ranks ? rank : 0);
  const torch::Tensor before = CpuRngState();
  try {
    SetCpuRngState(tensors.at("rng.cpu." + source));
    if (at::Generator gen = ModelCudaGenerator(model); gen.defined() && meta.cuda_rng) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(tensors.at("rng.cuda." + source));
    }
  } catch (const std::exception& e) {
    SetCpuRngState(before);
    throw CheckpointError(path + ": RNG state of rank " + source + " refused: " + e.what());
  }
}

}  // namespace

RngState CaptureRngState(torch::nn::Module& model) {
  RngState state;
  state.cpu = CpuRngState();
  if (at::Generator gen = ModelCudaGenerator(model); gen.defined()) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state.cuda = gen.get_state();
  }
  return state;
}

std::string CheckpointPath(const std::string& dir, int64_t global_step) {
  return StrFormat("%s/step-%09ld.safetensors", dir.c_str(), long(global_step));
}

void SaveCheckpoint(const std::string& path, torch::nn::Module& model, const AdamW& optimizer, const GradScaler& scaler,
                    const TrainProgress& progress, const std::vector<RngState>& rng_by_rank) {
  fs::create_directories(fs::path(path).parent_path());
  NamedTensors tensors;
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) tensors.emplace_back("model." + item.key(), item.value());
  for (const auto& [name, t] : optimizer.StateTensors()) tensors.emplace_back("optim." + name, t);
  const bool cuda = !rng_by_rank.empty() && rng_by_rank.front().cuda.defined();
  for (size_t r = 0; r < rng_by_rank.size(); ++r) {
    tensors.emplace_back("rng.cpu." + std::to_string(r), rng_by_rank[r].cpu);
    if (cuda) tensors.emplace_back("rng.cuda." + std::to_string(r), rng_by_rank[r].cuda);
  }
  CheckpointMeta meta;
  meta.progress = progress;
  meta.optimizer_steps = optimizer.step_count();
  meta.loss_scale = scaler.scale();
  meta.scale_growth_tracker = scaler.growth_tracker();
  meta.rng_ranks = static_cast<int64_t>(rng_by_rank.size());
  meta.cuda_rng = cuda;
  SaveSafetensors(path, tensors, CheckpointMetaStrings(meta));
}

LoadedCheckpoint LoadCheckpoint(const std::string& path, torch::nn::Module& model, AdamW& optimizer, GradScaler& scaler,
                                int rank, int64_t steps_per_epoch) {
  std::map<std::string, std::string> strings;
  TensorMap tensors;
  try {
    tensors = LoadSafetensors(path, &strings);
  } catch (const SafetensorsError& e) {
    throw CheckpointError(e.what());
  }
  const CheckpointMeta meta = ParseCheckpointMeta(strings, path);
  if (meta.progress.next_batch > steps_per_epoch)
    throw CheckpointError(path + ": checkpoint metadata 'next_batch': " + std::to_string(meta.progress.next_batch) +
                          " lies beyond this job's " + std::to_string(steps_per_epoch) +
                          " batches per epoch (another dataset or batch size?)");
  CheckTensors(tensors, meta, model, optimizer, path);
  RestoreRng(tensors, meta, model, rank, path);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters())
    if (item.value().requires_grad()) item.value().copy_(tensors.at("model." + item.key()));
  TensorMap optim;
  for (auto& [name, t] : tensors)
    if (name.rfind("optim.", 0) == 0) optim[name.substr(6)] = t;
  optimizer.RestoreState(optim, meta.optimizer_steps);
  scaler.Restore(static_cast<float>(meta.loss_scale), meta.scale_growth_tracker);
  return {meta.progress, meta.rng_ranks};
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && entry.path().extension() == ".safetensors") out.push_back(entry.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

void RemoveCheckpoints(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(fs::symlink_status(dir, error))) return;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.rfind("step-", 0) == 0 && (entry.path().extension() == ".safetensors" ||
                                                      name.find(".safetensors.tmp-") != std::string::npos);
    if (ours && !entry.is_directory(error)) fs::remove(entry.path(), error);
  }
}

void PruneCheckpoints(const std::string& dir, int keep, int64_t also_keep) {
  auto all = ListCheckpoints(dir);
  const std::string kept = also_keep > 0 ? CheckpointPath(dir, also_keep) : std::string();
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < all.size(); ++i)
    if (all[i] != kept) fs::remove(all[i]);
}

}  // namespace trainyard
