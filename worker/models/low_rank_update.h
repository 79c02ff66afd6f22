// LoRA's low-rank update of a layer's output as one autograd node, with its products
// laid out for the CPU's BLAS.
//
// Why: written as torch ops (y + linear(linear(x, A), B) * scaling, as PEFT does), an
// adapter costs two full-size element-wise passes (the scaling and the sum) forward and
// backward, and its skinny products (an inner or outer dimension of r = 8) run in
// layouts that MKL handles badly: on the project's 2-core machine dL/dB = g^T h took
// 1.7 ms and dL/dh = g B 0.9 ms for 4096 tokens of width 256, against 0.3 ms each for
// the same products computed transposed (h^T g, B^T g^T), whose long dimension is the
// output's inner one. Here h is kept transposed ([r, M]) throughout, the update is
// added into y in place by one addmm with the scaling as its alpha, and several
// adapters reading the same x (LoRA on the query and the value of a fused QKV
// projection) become one node over column ranges of one output.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace trainyard {

// y[..., column : column + out] += scaling * (x A^T) B^T, for A [r, in] and B [out, r].
struct LowRankUpdate {
  torch::Tensor a, b;
  double scaling = 1.0;
  int64_t column = 0;
};

// Adds every update into y [..., N] over its columns, all reading x [..., in], and
// returns the result: y itself, changed in place, when y is contiguous (its autograd
// history then ends in this node; nothing else may need y's old values), else a
// contiguous copy. Differentiable in y, x and every A and B. REQUIRES: y and x have the
// same leading dimensions; the updates' column ranges lie within N and do not overlap.
torch::Tensor AddLowRankUpdates(torch::Tensor y, const torch::Tensor& x, const std::vector<LowRankUpdate>& updates);

}  // namespace trainyard
