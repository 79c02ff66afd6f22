// How the gpu tests of our own kernels compare a fused result with the composition it
// replaces.
#pragma once

#include <torch/torch.h>

#include <algorithm>

namespace trainyard {

// max |a - b| / max(1, max |b|)
inline double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor bf = b.to(torch::kDouble);
  const double scale = std::max(1.0, bf.abs().max().item<double>());
  return (a.to(torch::kDouble) - bf).abs().max().item<double>() / scale;
}

// 1e-5 for fp32; one unit in the last place for a value stored in bf16 or fp16.
inline double ToleranceFor(const torch::Tensor& stored) {
  switch (stored.scalar_type()) {
    case torch::kBFloat16:
      return 1.0 / 128;
    case torch::kHalf:
      return 1.0 / 1024;
    default:
      return 1e-5;
  }
}

}  // namespace trainyard
