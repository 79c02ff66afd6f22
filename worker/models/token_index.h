// Unpadding: the dense layers of an encoder (projections, FFN, LayerNorm, dropout) work
// on each token alone, so they can run over the real tokens only, packed into [N, X]
// (N = the number of real tokens), and skip the padding. Only attention mixes tokens.
// Two ways to attend over packed tokens:
//   - scattered: the packed q, k and v go back to [B, S, X] (zeros at padding, which
//     the key mask hides), attend as usual, and the real rows of the result are
//     gathered. Any device and dtype; the gather and scatter cost a copy of each
//     activation per layer, so Worth() says when the skipped padding pays for them.
//   - varlen: on a GPU in bf16 or fp16, flash attention's variable-length kernel works
//     on the packed tokens themselves, each sequence delimited by its start
//     (worker/kernels/varlen_attention.h): no copies, and no padding computed at all.
// What a real token computes is the same either way; only the padding rows, which
// nothing reads, differ.
//
// Finding the real tokens (nonzero()) on a GPU makes the host wait for the device, and
// their count changes the shapes from batch to batch, which a CUDA graph cannot follow.
// So for GPU batches the host finds them, from the mask it has before the batch is
// copied (PackTokens, run by the data pipeline), and rounds their count up to a granule
// with padding positions ("filler") that form sequences of their own: a graph per
// rounded count then replays every batch, and the filler attends only to itself.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

namespace trainyard {

enum class Unpadding { kAuto, kAlways, kNever };
// "auto", "always", "never" (the job file's model.unpad). Throws std::invalid_argument.
Unpadding UnpaddingNamed(const std::string& name);

// The real tokens of a padded [B, S] batch, as PackTokens() finds them on the host. The
// packed order is the real tokens row by row, then the filler.
struct TokenPacking {
  // [N'] int64: the packed tokens' positions in the flattened [B * S].
  torch::Tensor index;
  // [B + 1 + K] int32: cumulative sequence lengths. Row b's tokens are packed at
  // [starts[b], starts[b + 1]); then come K filler sequences of at most S tokens each
  // (some may be empty), ending at N'. K depends on B, S and the granule only.
  torch::Tensor starts;
  int64_t batch = 0, seq = 0;
  bool defined() const { return index.defined(); }
  // The same on `device`; non_blocking from pinned host memory.
  TokenPacking To(const torch::Device& device, bool non_blocking) const;
};

// The packing of attention_mask [B, S] (a CPU tensor, nonzero = real), with the token
// count rounded up to a multiple of `granule` (at most B * S) by the first padding
// positions in row-major order. With pinned, its tensors are in page-locked memory.
// Throws std::invalid_argument for a mask that is not a 2-D CPU tensor or a granule < 1.
TokenPacking PackTokens(const torch::Tensor& attention_mask, int64_t granule, bool pinned = false);
// The granule of a CUDA-graphed step's batches of shape [B, S]: B * S / 16 rounded up to
// a multiple of 8, so each batch shape has at most 16 token counts (and graphs), and
// the filler is under a sixteenth of the padded batch.
int64_t GraphTokenGranule(int64_t batch, int64_t seq);

class TokenIndex {
 public:
  // The real tokens of attention_mask [B, S] (nonzero = real), in row-major order, found
  // on the mask's device (on CUDA, a wait for it).
  explicit TokenIndex(const torch::Tensor& attention_mask);
  // The tokens the host found (PackTokens), on packing's device; no wait.
  explicit TokenIndex(const TokenPacking& packing);
  // Whether unpadding a batch whose real tokens are this share of B x S pays on the
  // CPU: below kWorthShare. False for a CUDA mask (finding the tokens syncs the stream).
  static bool Worth(const torch::Tensor& attention_mask);
  static constexpr double kWorthShare = 0.9;
  // Whether a batch is unpadded under `policy`; keep_mask is KeyKeepMask()'s (undefined
  // when nothing is padded, so there is nothing to skip).
  static bool Wanted(Unpadding policy, const torch::Tensor& attention_mask, const torch::Tensor& keep_mask);

  // [B, S, X...] -> [N', X...]: the packed tokens' rows.
  torch::Tensor Pack(const torch::Tensor& padded) const;
  // [N', X...] -> [B, S, X...], zeros at padding the packing does not hold.
  // Differentiable, as Pack() is.
  torch::Tensor Unpack(const torch::Tensor& packed) const;
  // Position 0 of every row from the packed [N', X...]: [B, 1, X...]. A row without real
  // tokens reads another row's (nothing reads such a row: every text has its [CLS]).
  torch::Tensor FirstRows(const torch::Tensor& packed) const;

  // Whether Attend() runs on these packed q, k, v [N', heads, D] (the varlen kernel's
  // conditions, VarlenAttentionApplies).
  static bool AttendApplies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);
  // Bidirectional attention of each packed token over its own sequence's keys, q, k and
  // v [N', heads, D]; or, with first_only, of each row's position 0 alone, returning
  // [B, heads, D]. REQUIRES: AttendApplies(q, k, v).
  torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout,
                       bool first_only) const;

  int64_t tokens() const { return index_.size(0); }
  const torch::Tensor& starts() const { return starts_; }

 private:
  void FindFirstRows();

  torch::Tensor index_;   // [N'] int64 positions in the flattened [B * S]
  torch::Tensor starts_;  // [B + 1 + K] int32 (TokenPacking::starts)
  torch::Tensor first_;   // [B] int64: each row's first packed token
  int64_t batch_, seq_;
};

// The tokens an encoder runs over: the host's packing when given (the host decided),
// else the mask's real tokens where `policy` wants them (TokenIndex::Wanted), else none:
// the batch runs padded.
std::optional<TokenIndex> TokensToRun(const TokenPacking* packing, Unpadding policy,
                                      const torch::Tensor& attention_mask, const torch::Tensor& keep_mask);

}  // namespace trainyard
