// The launchers of fused_bias_gelu.cu, in ATen types only (nvcc compiles this header,
// so it stays off <torch/torch.h>). fused_bias_gelu.h is the interface to use.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace trainyard::cuda {

// Whether rows of `cols` values fit the kernels: 4-wide loads need cols % 4 == 0.
bool BiasGeluFits(int64_t cols);

// gelu(x + bias), the exact (erf) form, computed in fp32 and stored in x's dtype. x:
// fp32, bf16 or fp16, contiguous, its last dimension `cols`; bias: fp32 [cols]. Both on
// one CUDA device, their data aligned to 4 of their values.
at::Tensor BiasGeluForward(const at::Tensor& x, const at::Tensor& bias);

struct BiasGeluGrads {
  at::Tensor dx;     // x's dtype and shape
  at::Tensor dbias;  // fp32 [cols]: dx summed over the rows in fp32, before dx is rounded; undefined unless asked
};

// dy: x's dtype and shape, contiguous and aligned as x is; x and bias as the forward
// had them.
BiasGeluGrads BiasGeluBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias, bool bias_grad);

}  // namespace trainyard::cuda
