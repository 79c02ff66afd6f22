#include "worker/train/amp.h"

#include <ATen/autocast_mode.h>
#include <ATen/cpu/Utils.h>

namespace trainyard {

torch::ScalarType ComputeDtype(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return torch::kBFloat16;
    case Precision::kFp16:
      return torch::kHalf;
    case Precision::kFp32:
      break;
  }
  return torch::kFloat;
}

AutocastScope::AutocastScope(torch::DeviceType device, Precision precision) : device_(device) {
  if (precision == Precision::kFp32) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::set_autocast_dtype(device, ComputeDtype(precision));
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

std::string CpuBf16Caveat() {
  const auto capabilities = at::cpu::get_cpu_capabilities();
  const auto amx = capabilities.find("amx_bf16");
  if (amx != capabilities.end() && amx->second.isBool() && amx->second.toBool()) return "";
  return "bf16 on a CPU without AMX: its bf16 matrix multiplies (AVX512-BF16 or emulated) are no faster than "
         "fp32's and measured ~1.6x slower than fp32 end to end on such a CPU; fp32 is likely faster here (compare "
         "both in a "
         "kind: benchmark grid)";
}

GradScaler::GradScaler(const LossScaleSpec& spec, bool enabled)
    : spec_(spec), enabled_(enabled), scale_(static_cast<float>(spec.init_scale)) {}

torch::Tensor GradScaler::Scale(const torch::Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }

bool GradScaler::UnscaleAndCheck(const std::vector<torch::Tensor>& params) const {
  if (!enabled_) return false;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return false;
  auto options = torch::TensorOptions().dtype(torch::kFloat).device(grads.front().device());
  torch::Tensor found_inf = torch::zeros({1}, options);
  // Like torch: the reciprocal is taken in double, then rounded to float.
  torch::Tensor inv_scale = torch::full({1}, static_cast<float>(1.0 / double(scale_)), options);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  return found_inf.item<float>() != 0.0f;
}

void GradScaler::Update(bool found_inf) {
  if (!enabled_) return;
  if (found_inf) {
    scale_ = scale_ * static_cast<float>(spec_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  // >=, not ==: a checkpoint of a job with a longer growth_interval may resume here.
  if (++growth_tracker_ >= spec_.growth_interval) {
    scale_ = scale_ * static_cast<float>(spec_.growth_factor);
    growth_tracker_ = 0;
  }
}

void GradScaler::Restore(float scale, int64_t growth_tracker) {
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace trainyard
