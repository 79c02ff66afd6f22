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

// Dynamic loss scaling with the semantics, and the kernels, of torch.amp.GradScaler. The
// scale and its growth count live on the device, so a step under loss scaling never
// waits for it: the step, and its skip, can be replayed from a CUDA graph. Each step:
//   loss = Scale(loss); loss.backward();
//   found_inf = UnscaleAndCheck(params);   // grads divided by the scale; a device flag
//   (data-parallel: MAX-reduce found_inf across ranks here, so every rank decides alike)
//   optimizer step given found_inf (it leaves everything alone when the flag is set);
//   Update(found_inf);
// Update: an inf/NaN multiplies the scale by backoff_factor and restarts the growth
// count; growth_interval clean steps in a row multiply it by growth_factor.
class GradScaler {
 public:
  // REQUIRES: `device` is where the gradients will be.
  GradScaler(const LossScaleSpec& spec, bool enabled, torch::Device device = torch::kCPU);

  bool enabled() const { return enabled_; }
  // The loss times the scale (a one-element tensor, as torch's); the loss itself when off.
  torch::Tensor Scale(const torch::Tensor& loss) const;
  // Multiplies every defined gradient by 1/scale and returns a one-element float tensor
  // on the device: 1 if any value was inf or NaN, else 0. Undefined when scaling is off.
  torch::Tensor UnscaleAndCheck(const std::vector<torch::Tensor>& params) const;
  // `found_inf` as UnscaleAndCheck returned it (or the ranks' maximum of it). On the device.
  void Update(const torch::Tensor& found_inf);

  // Read from the device (a wait on CUDA): for logs and checkpoints, not for every step.
  float scale() const;
  int64_t growth_tracker() const;
  // The scale where it lives, for a step record to read later with others.
  const torch::Tensor& scale_tensor() const { return scale_; }
  void Restore(float scale, int64_t growth_tracker);

 private:
  LossScaleSpec spec_;
  bool enabled_;
  torch::Tensor scale_;           // float [1]
  torch::Tensor growth_tracker_;  // int32 [1]
};

}  // namespace trainyard
