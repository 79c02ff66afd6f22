// Building blocks the model families share: HF-named module nodes, multi-head
// attention over SDPA, and GPT-2's Conv1D.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "worker/kernels/compute_dtype_weights.h"
#include "worker/kernels/packed_linear.h"
#include "worker/models/low_rank_update.h"
#include "worker/models/token_index.h"

namespace trainyard {

// A plain module that only exists to give its children HF's dotted names
// ("bert.encoder.layer.0..."). Returns the node, owned by `parent`.
std::shared_ptr<torch::nn::Module> Node(torch::nn::Module& parent, const std::string& name);

torch::nn::LayerNorm MakeLayerNorm(int64_t size, double eps);

// Inverted dropout (kept values scaled by 1 / (1 - p)). On the CPU, for fp32, the mask
// comes from a counter-based hash (splitmix64 of seed + index) filled by every intra-op
// thread: ATen's bernoulli_ draws it serially from one generator and took ~40% of a
// BERT forward pass here (scripts/bench/lora_step_vs_peft.sh, torch.profiler on HF's
// side too). The seed is one draw from the default CPU generator, so a seed gives the
// same masks whatever the thread count, and checkpoints (which save that generator)
// resume the same stream. Elsewhere (CUDA, bf16) it is torch::dropout.
torch::Tensor ApplyDropout(const torch::Tensor& x, double p, bool training);

// GELU, the exact (erf) form. When a gradient is wanted for an fp32 CPU tensor it runs
// as one node that computes the derivative along with the value (gelu_kernels.h) and
// keeps it instead of the input, so the backward pass is one multiplication: ATen's
// gelu_backward evaluates erf and exp again, and with the forward took 5% of a LoRA
// step of BERT mini here (27 of 554 ms, scripts/bench/lora_step_vs_peft.sh). Same
// memory: the derivative takes the input's place. Elsewhere torch::gelu.
torch::Tensor Gelu(const torch::Tensor& u);

// torch::nn::Dropout with ApplyDropout() above.
class DropoutImpl : public torch::nn::Module {
 public:
  explicit DropoutImpl(double p) : p_(p) {}
  torch::Tensor forward(const torch::Tensor& x) { return ApplyDropout(x, p_, is_training()); }
  double p() const { return p_; }

 private:
  double p_;
};
TORCH_MODULE(Dropout);

// norm(dropout(x) + residual), the end of each encoder block. With `fused`, as one CUDA
// kernel pair where the tensors fit it (worker/kernels/fused_add_norm.h: on a GPU,
// fp32/bf16/fp16, the norm affine); otherwise the modules as they are.
torch::Tensor DropoutAddNorm(torch::nn::LayerNorm& norm, Dropout& dropout, const torch::Tensor& x,
                             const torch::Tensor& residual, bool fused);

// A module whose blocks end in DropoutAddNorm(): ModelImpl::set_fused_add_norm() finds
// them through this.
class FusableAddNorm {
 public:
  virtual ~FusableAddNorm() = default;
  virtual void set_fused_add_norm(bool on) = 0;
};

// Position ids 0..S-1 ([1, S]) for input_ids [B, S]. Throws std::invalid_argument when S
// exceeds the model's `positions`.
torch::Tensor PositionsFromZero(const torch::Tensor& input_ids, int64_t positions);

// [B, S, heads*D] -> [B, heads, S, D], and back.
torch::Tensor SplitHeads(const torch::Tensor& x, int64_t heads);
torch::Tensor MergeHeads(const torch::Tensor& x);

// The [B, 1, T, L] bool mask of T queries at the end of L keys: a query keeps the keys
// at or before its own position whose key_keep [B, L] is true, and always its own key,
// so the row of a padding token, whose earlier keys are all padding, is not fully
// masked (which gives NaN); real tokens keep their own key anyway.
torch::Tensor CausalKeepMask(const torch::Tensor& key_keep, int64_t queries);

// Multi-head scaled dot-product attention over projected q, k, v [B, S, heads*D].
// keep_mask: the [B, 1, 1, Sk] bool key mask of KeyKeepMask (true where a key may be
// attended), or undefined for "every key". causal adds the lower-triangular mask
// (SDPA's own when keep_mask is undefined, so its fused kernels stay usable; else
// CausalKeepMask). scale: 1/sqrt(D) when unset. Returns [B, Sq, heads*D].
torch::Tensor MultiHeadAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t heads,
                                 const torch::Tensor& keep_mask, double dropout, bool causal,
                                 std::optional<double> scale = std::nullopt);

// at::scaled_dot_product_attention over [B, heads, S, D] tensors, except where
// PyTorch's CPU flash kernel cannot run: where oneDNN can pack bf16 or fp16 operands
// (cpublas::could_pack: a CPU with AMX) the kernel packs them, which ATen allows only at
// its AVX-512 capability, so with ATEN_CPU_CAPABILITY set lower (avx2, default) it throws
// "pack_vnni2 is only supported when avx512 is supported". There it takes SDPA's math
// path instead.
torch::Tensor ScaledDotProductAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const std::optional<torch::Tensor>& mask, double dropout, bool causal,
                                        std::optional<double> scale);

// The [B, 1, 1, S] key mask of a [B, S] attention_mask (1 = real token), or undefined
// when nothing is padded. A batch without padding needs no mask, and without one SDPA
// can take its fused kernels (on CPU a masked call falls back to the reference path).
// Checked for CPU tensors only: on a GPU the check would stall the stream and break
// graph capture, so GPU batches always get the mask.
torch::Tensor KeyKeepMask(const torch::Tensor& attention_mask);

// What LoRA adds to a layer, as PEFT's LoraLayer does: y += B(A(dropout(x))) * scaling,
// with A [r, in] and B [out, r] registered on the layer as the child modules "lora_A"
// and "lora_B", so their parameters carry PEFT's names ("<layer>.lora_A.weight"). A
// starts kaiming-uniform (a = sqrt(5)), B at zero, so an adapted layer starts equal to
// the base one.
class LoraSlot {
 public:
  bool adapted() const { return static_cast<bool>(a_); }
  // REQUIRES: not adapted yet. `layer` is the module this slot belongs to.
  void Attach(torch::nn::Module& layer, int64_t in_features, int64_t out_features, int64_t r, double scaling,
              double dropout);
  // y [..., out] with the adapter's contribution for input x [..., in] added, in place
  // where it can be (AddLowRankUpdates); REQUIRES adapted().
  torch::Tensor AddTo(const torch::Tensor& y, const torch::Tensor& x, bool training) const;
  // The adapter as an update of output columns [column, column + out); REQUIRES adapted().
  LowRankUpdate Update(int64_t column) const { return {a_->weight, b_->weight, scaling_, column}; }
  double dropout() const { return dropout_; }
  // scaling * B @ A, [out, in]: what merging adds to a Linear's weight.
  torch::Tensor DeltaWeight() const;

 private:
  torch::nn::Linear a_{nullptr}, b_{nullptr};
  double scaling_ = 0, dropout_ = 0;
};

// torch::nn::Linear that LoRA can adapt (the families use it for every projection).
class AdaptableLinearImpl : public torch::nn::LinearImpl {
 public:
  AdaptableLinearImpl(int64_t in_features, int64_t out_features, bool with_bias = true);
  torch::Tensor forward(const torch::Tensor& x);
  // forward(x) less the bias, for a caller that adds the bias itself (DenseDropoutAddNorm,
  // DenseGelu):
  // on the paths a CUDA input takes (the plain product, or the cast copies), LoRA
  // included. nullopt where forward() would take another path (int8, the CPU's own
  // kernels) or there is no bias.
  std::optional<torch::Tensor> forward_without_bias(const torch::Tensor& x);
  LoraSlot lora;
  c10::IValue int8_weight;   // set by QuantizeLinearsInt8 (quantize.h): forward runs on it
  PackedLinear packed;       // the weight reordered for oneDNN, when frozen (packed_linear.h)
  ComputeDtypeWeights cast;  // the weight in autocast's dtype, when frozen (compute_dtype_weights.h)
};
TORCH_MODULE(AdaptableLinear);

// norm(dropout(dense(x)) + residual): DropoutAddNorm() after a dense layer. With `fused`
// and the tensors on a GPU, the dense product leaves its bias out and the fused kernels
// add it, so its gradient comes from their backward pass rather than a reduction of
// its own; otherwise dense(x), then DropoutAddNorm().
torch::Tensor DenseDropoutAddNorm(AdaptableLinear& dense, torch::nn::LayerNorm& norm, Dropout& dropout,
                                  const torch::Tensor& x, const torch::Tensor& residual, bool fused);

// Gelu(dense(x)). With `fused` and x on a GPU, the dense product leaves its bias out and
// one kernel adds it and applies GELU (worker/kernels/fused_bias_gelu.h), whose backward
// also sums the bias's gradient; otherwise dense(x), then Gelu().
torch::Tensor DenseGelu(AdaptableLinear& dense, const torch::Tensor& x, bool fused);

// GPT-2's Conv1D: a Linear whose weight is stored transposed, [in, out], as HF stores it,
// so checkpoints round-trip without copies. forward(x) = x @ weight + bias (+ LoRA).
class Conv1DImpl : public torch::nn::Module {
 public:
  Conv1DImpl(int64_t in_features, int64_t out_features);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  LoraSlot lora;
  c10::IValue int8_weight;   // set by QuantizeLinearsInt8 (quantize.h): forward runs on it
  PackedLinear packed;       // the weight reordered for oneDNN, when frozen (packed_linear.h)
  ComputeDtypeWeights cast;  // the weight in autocast's dtype, when frozen (compute_dtype_weights.h)
};
TORCH_MODULE(Conv1D);

// x through the query, key and value projections at once: one GEMM over their
// concatenated weights, so the forward and the backward each make one matmul instead
// of three. Returns [..., 3 * out], q then k then v. LoRA adapters are added over their
// columns of that product (AddLowRankUpdates). A projection quantized to int8 needs its
// own forward; then the three run apart, concatenated.
// `fused` keeps the concatenated weight's derived forms from call to call: its oneDNN
// reorder (packed_linear.h) and its copy in autocast's dtype (compute_dtype_weights.h),
// each for frozen weights. It belongs to the layer that owns the three projections.
struct FusedQkvWeights {
  PackedLinear packed;
  ComputeDtypeWeights cast;
};
torch::Tensor ProjectQkv(AdaptableLinear& query, AdaptableLinear& key, AdaptableLinear& value, const torch::Tensor& x,
                         FusedQkvWeights& fused);

// The positions an encoder layer's output is wanted at. A sequence classifier reads its
// last layer at position 0 alone (BERT's [CLS], RoBERTa's <s>): there, with kFirst, the
// attention takes that position's query alone (keys and values still cover every
// token), and the attention output, the FFN and their gradients run on B rows instead
// of B x S. Position 0 gets the same values either way; in a 4-layer model that is
// about a fifth of a training step's products.
enum class Rows { kAll, kFirst };

// Bidirectional multi-head self-attention over qkv from ProjectQkv(): [B, S, 3 * H]
// (MultiHeadAttention), or, when `tokens` is given, the packed [N, 3 * H] of those
// tokens, for which it returns the packed [N, H] result: through the varlen kernel where
// it applies, else scattered (token_index.h). Under Rows::kFirst the
// result is position 0's, [B, 1, H], packed or not.
torch::Tensor SelfAttention(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& keep_mask, double dropout,
                            const TokenIndex* tokens, Rows rows = Rows::kAll);

// Position 0 of hidden [B, S, H], or of the packed [N, H] of `tokens`: [B, 1, H].
torch::Tensor FirstRows(const torch::Tensor& hidden, const TokenIndex* tokens);

}  // namespace trainyard

namespace trainyard {

// HF's _init_weights for the modules we use: Linear, Conv1D and Embedding weights from
// N(0, std), zero biases, unit LayerNorms, an Embedding's padding_idx row zero.
// The model itself is not visited (it may be under construction), only its descendants.
void InitHfStyle(torch::nn::Module& model, double std);

}  // namespace trainyard
