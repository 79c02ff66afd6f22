// Dropout, residual add and LayerNorm as one CUDA kernel forward and one backward: the
// "dropout+residual+LayerNorm" fusion the whole-step profile points at (each BERT layer
// ends its attention and its feed-forward block with it). Unfused, autograd runs a
// dropout kernel, an add, LayerNorm's forward and, backward, LayerNorm's two backward
// kernels, the residual's gradient add and the dropout mask's multiply, each a pass over
// the [tokens, hidden] activations; fused, each direction is one pass (plus a small sum
// of the weight gradients' per-block partials).
//
// The product that makes x may leave its bias out and pass it as x_bias: the kernels add
// it to x (in fp32) before the dropout, and the backward sums its gradient in the same
// pass as the norm's own, where autograd would launch a reduction over [tokens, hidden]
// for each product's bias.
//
// Numerics: the sum and the normalisation run in fp32 whatever the input dtype, as
// ATen's LayerNorm does under autocast; the result takes the residual's dtype (fp32 in
// an autocast step, whose residual stream is LayerNorm's fp32 output). The dropout mask
// comes from the default CUDA generator's Philox stream, as torch::dropout's does, but
// is not the same draw, so a fused and an unfused run agree exactly only without dropout.
#pragma once

#include <torch/torch.h>

namespace trainyard {

// Whether FusedDropoutAddNorm() runs the fused kernels for these tensors: both on one
// CUDA device, same shape, x fp32/bf16/fp16, residual fp32 or x's dtype, the norm's
// weight and bias (and x_bias, when defined) fp32 of the last dimension, and that
// dimension at most 2048. In a build without CUDA code, never.
bool FusedAddNormApplies(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                         const torch::Tensor& bias, const torch::Tensor& x_bias = {});

// LayerNorm(dropout(x + x_bias, p) + residual) with the norm's weight, bias and eps,
// dropout only when `training`; x_bias undefined adds nothing. Differentiable in x,
// residual, weight, bias and x_bias. Where FusedAddNormApplies() is false, runs the
// unfused composition (an add in x's dtype, torch::dropout, add, torch::layer_norm), so
// callers need not check.
torch::Tensor FusedDropoutAddNorm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                                  const torch::Tensor& bias, double eps, double p, bool training,
                                  const torch::Tensor& x_bias = {});

// The same, fused kernels only (FusedAddNormApplies() must hold), returning the keep
// mask it drew (uint8, 1 = kept; undefined without dropout) beside the result: for tests.
std::pair<torch::Tensor, torch::Tensor> FusedDropoutAddNormWithMask(const torch::Tensor& x,
                                                                    const torch::Tensor& residual,
                                                                    const torch::Tensor& weight,
                                                                    const torch::Tensor& bias, double eps, double p,
                                                                    bool training, const torch::Tensor& x_bias = {});

}  // namespace trainyard
