#include "worker/kernels/compute_dtype_weights.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "worker/kernels/weight_stamp.h"

#ifdef TRAINYARD_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace trainyard {

struct ComputeDtypeWeights::Cast {
  at::ScalarType dtype;
  std::vector<WeightStamp> stamps;    // of the weights and biases the copies were made from
  std::vector<c10::Storage> sources;  // theirs, kept alive (weight_stamp.h)
  Copies copies;
};

namespace {

std::atomic<bool> weight_casts_once{true};

bool LowPrecision(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Autocast's compute dtype for tensors on `device`, or Undefined when autocast is off there.
at::ScalarType AutocastDtype(const torch::Device& device) {
  const at::DeviceType type = device.type();
  if (!at::autocast::is_autocast_available(type) || !at::autocast::is_autocast_enabled(type))
    return at::ScalarType::Undefined;
  return at::autocast::get_autocast_dtype(type);
}

bool FrozenFloatOn(const torch::Tensor& t, const torch::Device& device) {
  return t.scalar_type() == torch::kFloat && t.device() == device && !t.requires_grad();
}

bool Capturing([[maybe_unused]] const torch::Device& device) {
#ifdef TRAINYARD_WITH_CUDA
  if (device.is_cuda()) return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#endif
  return false;
}

}  // namespace

void SetWeightCastsOnce(bool on) { weight_casts_once.store(on); }

bool WeightCastsOnce() { return weight_casts_once.load(); }

bool ComputeDtypeWeights::Applies(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                                  c10::ArrayRef<torch::Tensor> biases) {
  if (!WeightCastsOnce()) return false;
  if (!x.defined() || x.dim() < 1 || x.numel() == 0) return false;
  if (weights.empty() || biases.size() != weights.size()) return false;
  if (!LowPrecision(AutocastDtype(x.device()))) return false;
  for (const auto& w : weights)
    if (!w.defined() || w.dim() != 2 || !FrozenFloatOn(w, x.device())) return false;
  for (const auto& b : biases) {
    if (b.defined() != biases[0].defined()) return false;
    if (b.defined() && !FrozenFloatOn(b, x.device())) return false;
  }
  return !torch::jit::tracer::isTracing();
}

std::shared_ptr<const ComputeDtypeWeights::Cast> ComputeDtypeWeights::Make(c10::ArrayRef<torch::Tensor> weights,
                                                                           c10::ArrayRef<torch::Tensor> biases,
                                                                           at::ScalarType dtype) {
  // Plain tensors, made outside autograd and inference mode, so that a pass that
  // trains (LoRA over frozen base weights) may keep them in its graph.
  c10::InferenceMode not_inference(false);
  torch::NoGradGuard no_grad;
  auto made = std::make_shared<Cast>();
  made->dtype = dtype;
  made->stamps = StampsOf(weights, biases);
  made->sources = SourcesOf(weights, biases);
  made->copies.weight = Concatenated(weights).to(dtype);
  if (biases[0].defined()) made->copies.bias = Concatenated(biases).to(dtype);
  return made;
}

ComputeDtypeWeights::Copies ComputeDtypeWeights::Current(c10::ArrayRef<torch::Tensor> weights,
                                                         c10::ArrayRef<torch::Tensor> biases) {
  const at::ScalarType dtype = AutocastDtype(weights[0].device());
  const std::vector<WeightStamp> stamps = StampsOf(weights, biases);
  std::lock_guard<std::mutex> lock(mutex_);
  auto same_dtype = std::find_if(casts_.begin(), casts_.end(), [&](const auto& c) { return c->dtype == dtype; });
  if (same_dtype != casts_.end() && (*same_dtype)->stamps == stamps) return (*same_dtype)->copies;
  if (Capturing(weights[0].device())) return {};
  std::shared_ptr<const Cast> made = Make(weights, biases, dtype);
  ++copies_made_;
  if (same_dtype != casts_.end())
    *same_dtype = made;
  else
    casts_.push_back(made);
  return made->copies;
}

torch::Tensor ComputeDtypeWeights::Forward(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                                           c10::ArrayRef<torch::Tensor> biases) {
  const Copies copies = Current(weights, biases);
  if (!copies.weight.defined()) {  // capturing, with no copy current: autocast's casts, in the graph
    const torch::Tensor bias = biases[0].defined() ? Concatenated(biases) : torch::Tensor();
    return torch::linear(x, Concatenated(weights), bias);
  }
  return torch::linear(x, copies.weight, copies.bias);
}

int64_t ComputeDtypeWeights::copies_made() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copies_made_;
}

}  // namespace trainyard
