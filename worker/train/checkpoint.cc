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
constexpr const char* kFormat = "trainyard-checkpoint-1";

std::string Exact(double value) { return StrFormat("%.17g", value); }

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
at::Generator ModelCudaGenerator(BertForSequenceClassification& model) {
#ifdef TRAINYARD_WITH_CUDA
  const torch::Device device = model->parameters().front().device();
  if (device.is_cuda()) return at::cuda::detail::getDefaultCUDAGenerator(device.index());
#endif
  return at::Generator();
}

std::map<std::string, std::string> ProgressMetadata(const TrainProgress& p, const GradScaler& s,
                                                    const AdamW& optimizer) {
  return {{"format", kFormat},
          {"epoch", std::to_string(p.epoch)},
          {"next_batch", std::to_string(p.next_batch)},
          {"global_step", std::to_string(p.global_step)},
          {"epoch_loss_sum", Exact(p.epoch_loss_sum)},
          {"epoch_examples", std::to_string(p.epoch_examples)},
          {"epoch_steps", std::to_string(p.epoch_steps)},
          {"epoch_skipped", std::to_string(p.epoch_skipped)},
          {"optimizer_steps", std::to_string(optimizer.step_count())},
          {"loss_scale", Exact(s.scale())},
          {"scale_growth_tracker", std::to_string(s.growth_tracker())}};
}

const std::string& Field(const std::map<std::string, std::string>& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw CheckpointError(path + ": not a Trainyard checkpoint (no '" + key + "' metadata)");
  return it->second;
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int64_t global_step) {
  return StrFormat("%s/step-%09ld.safetensors", dir.c_str(), long(global_step));
}

void SaveCheckpoint(const std::string& path, BertForSequenceClassification& model, const AdamW& optimizer,
                    const GradScaler& scaler, const TrainProgress& progress) {
  fs::create_directories(fs::path(path).parent_path());
  NamedTensors tensors;
  for (const auto& item : model->named_parameters()) tensors.emplace_back("model." + item.key(), item.value());
  for (const auto& [name, t] : optimizer.StateTensors()) tensors.emplace_back("optim." + name, t);
  tensors.emplace_back("rng.cpu", CpuRngState());
  if (at::Generator gen = ModelCudaGenerator(model); gen.defined()) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors.emplace_back("rng.cuda", gen.get_state());
  }
  SaveSafetensors(path, tensors, ProgressMetadata(progress, scaler, optimizer));
}

TrainProgress LoadCheckpoint(const std::string& path, BertForSequenceClassification& model, AdamW& optimizer,
                             GradScaler& scaler) {
  std::map<std::string, std::string> meta;
  std::map<std::string, torch::Tensor> tensors;
  try {
    tensors = LoadSafetensors(path, &meta);
  } catch (const SafetensorsError& e) {
    throw CheckpointError(e.what());
  }
  if (Field(meta, "format", path) != kFormat)
    throw CheckpointError(path + ": unknown checkpoint format '" + meta["format"] + "'");
  try {
    torch::NoGradGuard no_grad;
    std::map<std::string, torch::Tensor> optim;
    for (auto& item : model->named_parameters()) {
      auto it = tensors.find("model." + item.key());
      if (it == tensors.end() || it->second.sizes() != item.value().sizes())
        throw CheckpointError(path + ": model tensor '" + item.key() +
                              "' is missing or has another shape than this job's model");
      item.value().copy_(it->second);
    }
    for (auto& [name, t] : tensors)
      if (name.rfind("optim.", 0) == 0) optim[name.substr(6)] = t;
    optimizer.RestoreState(optim, std::stoll(Field(meta, "optimizer_steps", path)));
    scaler.Restore(std::stof(Field(meta, "loss_scale", path)), std::stoll(Field(meta, "scale_growth_tracker", path)));
    if (tensors.count("rng.cpu")) SetCpuRngState(tensors.at("rng.cpu"));
    if (at::Generator gen = ModelCudaGenerator(model); gen.defined() && tensors.count("rng.cuda")) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(tensors.at("rng.cuda"));
    }
    TrainProgress p;
    p.epoch = std::stoll(Field(meta, "epoch", path));
    p.next_batch = std::stoll(Field(meta, "next_batch", path));
    p.global_step = std::stoll(Field(meta, "global_step", path));
    p.epoch_loss_sum = std::stod(Field(meta, "epoch_loss_sum", path));
    p.epoch_examples = std::stoll(Field(meta, "epoch_examples", path));
    p.epoch_steps = std::stoll(Field(meta, "epoch_steps", path));
    p.epoch_skipped = std::stoll(Field(meta, "epoch_skipped", path));
    return p;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": " + e.what());
  }
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && entry.path().extension() == ".safetensors") out.push_back(entry.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::optional<std::string> LatestValidCheckpoint(const std::string& dir, std::vector<std::string>* rejected) {
  for (const auto& path : ListCheckpoints(dir)) {
    try {
      SafetensorsFile file = SafetensorsFile::Read(path);
      if (file.metadata().count("format") && file.metadata().at("format") == kFormat) return path;
      rejected->push_back(path + ": not a Trainyard checkpoint");
    } catch (const SafetensorsError& e) {
      rejected->push_back(e.what());
    }
  }
  return std::nullopt;
}

void PruneCheckpoints(const std::string& dir, int keep) {
  auto all = ListCheckpoints(dir);
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) fs::remove(all[i]);
}

}  // namespace trainyard
