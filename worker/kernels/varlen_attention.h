// Attention over packed sequences of different lengths, on a GPU: libtorch's flash
// attention kernel in its variable-length form, where the tokens of every sequence lie
// one after another in [N, heads, D] and cumulative lengths say where each sequence
// starts. No padding is stored or computed, and a token attends to the keys of its own
// sequence only.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>

namespace trainyard {

// Whether VarlenAttention() can run on these [N, heads, D] tensors: on a CUDA device of
// compute capability 8.0 or newer (flash attention's), in bf16 or fp16, with a head
// size that is a multiple of 8 and at most 256. False in a build without CUDA.
bool VarlenAttentionApplies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// softmax(q k^T * scale) v per sequence. q: [Nq, heads, D], k and v: [Nk, heads, D], each
// with unit stride in D. q_starts and k_starts: int32 [sequences + 1] on the same device,
// non-decreasing from 0 to Nq and Nk: sequence i's queries are q[q_starts[i],
// q_starts[i + 1]) and its keys k[k_starts[i], k_starts[i + 1]). A sequence may be empty.
// longest_q and longest_k bound every sequence's length (a bound, not the exact
// maximum, so that the host need not read the lengths; the kernel's grid grows with
// them). dropout: on the attention probabilities, drawn from the CUDA generator (graph
// capture safe). scale: 1/sqrt(D) when unset. Returns [Nq, heads, D]; differentiable in
// q, k and v. REQUIRES: VarlenAttentionApplies(q, k, v).
torch::Tensor VarlenAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& q_starts, const torch::Tensor& k_starts, int64_t longest_q,
                              int64_t longest_k, double dropout, std::optional<double> scale = std::nullopt);

}  // namespace trainyard
