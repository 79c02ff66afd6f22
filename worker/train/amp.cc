#include "worker/train/amp.h"

#include <ATen/autocast_mode.h>
#include <ATen/cpu/Utils.h>

#include <algorithm>

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

GradScaler::GradScaler(const LossScaleSpec& spec, bool enabled, torch::Device device)
    : spec_(spec),
      enabled_(enabled),
      scale_(torch::full({1}, static_cast<float>(spec.init_scale), torch::TensorOptions(torch::kFloat).device(device))),
      growth_tracker_(torch::zeros({1}, torch::TensorOptions(torch::kInt).device(device))) {}

torch::Tensor GradScaler::Scale(const torch::Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }

torch::Tensor GradScaler::UnscaleAndCheck(const std::vector<torch::Tensor>& params) const {
  if (!enabled_) return {};
  torch::NoGradGuard no_grad;
  torch::Tensor found_inf = torch::zeros({1}, scale_.options());
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return found_inf;
  // Like torch: the reciprocal is taken in double, then rounded to float.
  torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  return found_inf;
}

void GradScaler::Update(const torch::Tensor& found_inf) {
  if (!enabled_) return;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf, spec_.growth_factor, spec_.backoff_factor,
                         spec_.growth_interval);
}

float GradScaler::scale() const { return scale_.to(torch::kCPU).item<float>(); }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.to(torch::kCPU).item<int64_t>(); }

void GradScaler::Restore(float scale, int64_t growth_tracker) {
  scale_.fill_(scale);
  // A checkpoint of a job with a longer growth_interval may carry a count past this
  // job's; torch's update grows only on reaching the interval exactly, so such a count
  // is taken as one short of it: the next clean step grows the scale.
  growth_tracker_.fill_(std::min<int64_t>(growth_tracker, std::max<int64_t>(0, spec_.growth_interval - 1)));
}

}  // namespace trainyard
