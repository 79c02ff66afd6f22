// Products of a few rows with a large fp32 weight on the CPU: the shape of batch-1 (and
// small-batch) decoding, where every step streams every weight from memory once.
//
// Why not at::addmm: at a few rows MKL's sgemm reads a weight that does not fit the
// caches at 12-19 GB/s on this project's 2-core reference CPU, where a plain streaming
// loop, four weight rows at a time, reaches 23-27 GB/s. scripts/bench/gemv_vs_mkl.sh
// prints both: ours is about 2x faster from 1 to 16 rows, 1.4x at 32, even at 128.
// Decoding GPT-2 small is nothing but that read, so it is most of a decode step.
//
// Contract: x is [..., K] float on the CPU; the result is [..., N] float, equal to
// x @ W (+ bias) up to the order of the sums. Every thread reads a contiguous slice of
// the weight exactly once, whatever the row count.
#pragma once

#include <torch/torch.h>

namespace trainyard {

// The row count up to which RowProductApplies says yes: well inside where the kernels
// measured twice as fast as at::addmm, leaving room for CPUs where MKL does better.
inline constexpr int64_t kMaxRowProductRows = 16;

// True when x times `weight` may go through the kernels below: x and weight fp32 on
// the CPU, weight contiguous and 2-D, at most kMaxRowProductRows rows of x, no gradient
// wanted (autograd does not see these kernels) and no CPU autocast (which would run the
// product in bf16).
bool RowProductApplies(const torch::Tensor& x, const torch::Tensor& weight);

// x @ weight + bias for a weight stored [K, N] (GPT-2's Conv1D layout). bias may be
// undefined.
torch::Tensor RowsTimesWeight(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// x @ weight^T + bias for a weight stored [N, K] (nn.Linear's layout, and a tied
// embedding used as an LM head). bias may be undefined.
torch::Tensor RowsTimesWeightT(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace trainyard
