// The launchers of fused_add_norm.cu, in ATen types only (nvcc compiles this header,
// so it stays off <torch/torch.h>). fused_add_norm.h is the interface to use.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace trainyard::cuda {

// Whether a row of `hidden` values fits the kernels (one block holds a row in registers).
bool AddNormFits(int64_t hidden);

struct AddNormForwardResult {
  at::Tensor y;     // LayerNorm(dropout(x + x_bias) + residual), residual's dtype
  at::Tensor sum;   // dropout(x + x_bias) + residual, fp32: what the backward normalises again
  at::Tensor mean;  // [rows] fp32
  at::Tensor rstd;  // [rows] fp32: 1 / sqrt(var + eps)
  at::Tensor keep;  // uint8, 1 where x was kept; undefined when p == 0
};

// x: fp32, bf16 or fp16; x_bias: fp32 [hidden], added to x in fp32 before the dropout,
// or undefined for none; residual: fp32 or x's dtype, x's shape; weight, bias: fp32
// [hidden]. All contiguous on one CUDA device. p: the drop probability (0: none).
AddNormForwardResult AddNormForward(const at::Tensor& x, const at::Tensor& x_bias, const at::Tensor& residual,
                                    const at::Tensor& weight, const at::Tensor& bias, double eps, double p);

struct AddNormGrads {
  at::Tensor dx, dresidual, dweight, dbias;
  at::Tensor dx_bias;  // fp32 [hidden]; undefined without x_bias
};

// dy: contiguous, the forward's y dtype; the rest as AddNormForward saved them; x_bias:
// whether the forward had one (then dx_bias is dx summed over the rows, in fp32 before
// dx is rounded to x's dtype).
AddNormGrads AddNormBackward(const at::Tensor& dy, const at::Tensor& sum, const at::Tensor& weight,
                             const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& keep, double p,
                             at::ScalarType x_type, bool x_bias);

}  // namespace trainyard::cuda
