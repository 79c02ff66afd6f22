// Mixed precision: an autocast scope and a dynamic loss scaler with the semantics of
// torch.amp.GradScaler.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/spec/job_spec.h"

namespace trainyard {

// Turns autocast on for `device` with the precision's dtype for its lifetime (no-op
// for fp32). Not thread-safe across threads: autocast state is thread-local.
class AutocastScope {
 public:
  AutocastScope(torch::DeviceType device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  torch::DeviceType device_;
  bool active_ = false, previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kFloat;
};

// The dtype autocast computes in under `precision`: float for fp32.
torch::ScalarType ComputeDtype(Precision precision);

// Why bf16 autocast is likely slower than fp32 on this CPU, or "" when the CPU has AMX.
// Without AMX, oneDNN's bf16 matrix multiplies use AVX512-BF16 dot products, whose peak
// is fp32 FMA's: measured here (2 threads, 1024x256 by 256x1024) 3.8 ms against MKL's
// fp32 2.2 ms, with prepacked weights no better, and autocast's casts add ~5% on top.
// With AMX (amx_bf16) its tile kernels do several times fp32's work per cycle.
std::string CpuBf16Caveat();

// Dynamic loss scaling. Each step:
//   loss = Scale(loss); loss.backward();
//   bool found_inf = UnscaleAndCheck(params);   // grads divided by the scale
//   (data-parallel: OR found_inf across ranks here, so every rank decides alike)
//   if (!found_inf) optimizer step;
//   Update(found_inf);
// Update: an inf/NaN multiplies the scale by backoff_factor and restarts the growth
// count; growth_interval clean steps in a row multiply it by growth_factor. The scale
// is kept as a float, like the fp32 tensor torch keeps, so the sequences match.
class GradScaler {
 public:
  GradScaler(const LossScaleSpec& spec, bool enabled);

  bool enabled() const { return enabled_; }
  torch::Tensor Scale(const torch::Tensor& loss) const;
  // Multiplies every defined gradient by 1/scale; true if any value is inf or NaN.
  bool UnscaleAndCheck(const std::vector<torch::Tensor>& params) const;
  void Update(bool found_inf);

  float scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  void Restore(float scale, int64_t growth_tracker);

 private:
  LossScaleSpec spec_;
  bool enabled_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

}  // namespace trainyard
