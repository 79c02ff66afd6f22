// A product's bias and GELU as one CUDA kernel forward and one backward: the
// "bias+GELU" fusion the whole-step profile points at (each BERT layer's intermediate
// product is followed by GELU). Unfused, the product adds its bias in its epilogue,
// GELU is a kernel each way, and autograd sums the bias's gradient with a reduction over
// the [tokens, intermediate] gradient of its own; fused, the product runs without its
// bias, the forward kernel adds it in fp32 and applies GELU, and the backward applies
// GELU's derivative and sums the bias's gradient in the same pass.
//
// Numerics: the exact (erf) GELU in fp32, as ATen computes it, with the bias added in
// fp32 (the unfused product adds it in its own dtype under autocast); the result takes
// x's dtype. The bias's gradient is summed in fp32 before dx is rounded to x's dtype.
// What is saved for the backward is x, the input, where autograd saves GELU's input:
// the same memory.
#pragma once

#include <torch/torch.h>

namespace trainyard {

// Whether FusedBiasGelu() runs the fused kernels for these tensors: both on one CUDA
// device, x fp32/bf16/fp16, bias fp32 of x's last dimension, which is a multiple of 4.
// In a build without CUDA code, never.
bool FusedBiasGeluApplies(const torch::Tensor& x, const torch::Tensor& bias);

// gelu(x + bias), the exact form, differentiable in x and bias. Where
// FusedBiasGeluApplies() is false, runs the unfused composition (the bias added in x's
// dtype, then torch::gelu), so callers need not check.
torch::Tensor FusedBiasGelu(const torch::Tensor& x, const torch::Tensor& bias);

}  // namespace trainyard
