#include "worker/models/layers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "worker/kernels/fused_add_norm.h"
#include "worker/kernels/fused_bias_gelu.h"
#include "worker/kernels/gelu_kernels.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/parallel_slices.h"
#include "worker/models/quantize.h"

namespace trainyard {

std::shared_ptr<torch::nn::Module> Node(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

torch::nn::LayerNorm MakeLayerNorm(int64_t size, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({size}).eps(eps));
}

torch::Tensor DropoutAddNorm(torch::nn::LayerNorm& norm, Dropout& dropout, const torch::Tensor& x,
                             const torch::Tensor& residual, bool fused) {
  if (fused && FusedAddNormApplies(x, residual, norm->weight, norm->bias))
    return FusedDropoutAddNorm(x, residual, norm->weight, norm->bias, norm->options.eps(), dropout->p(),
                               dropout->is_training());
  return norm(dropout(x) + residual);
}

namespace {

uint64_t DrawSeed() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(generator)->random64();
}

// splitmix64's finaliser: a well-mixed 64-bit value for each (seed, index).
inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Calls body(begin, end) over [0, count) cut into one range per intra-op thread, none
// shorter than 16K elements (below that a thread costs more than it saves).
void ForEachRange(int64_t count, const std::function<void(int64_t, int64_t)>& body) {
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count >> 14));
  ParallelSlices(slices, int(slices), [&](int64_t s) { body(count * s / slices, count * (s + 1) / slices); });
}

}  // namespace

torch::Tensor ApplyDropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  if (x.is_cuda() || x.scalar_type() != torch::kFloat || p >= 1.0) return torch::dropout(x, p, training);
  const uint64_t seed = DrawSeed();
  torch::Tensor mask = torch::empty(x.sizes(), x.options().requires_grad(false));
  float* out = mask.data_ptr<float>();
  const auto threshold = static_cast<uint32_t>(p * 4294967296.0);
  const auto keep = static_cast<float>(1.0 / (1.0 - p));
  ForEachRange(mask.numel(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = static_cast<uint32_t>(Mix(seed + uint64_t(i) * 0x9E3779B97F4A7C15ull) >> 32) >= threshold ? keep : 0.0f;
  });
  return x * mask;
}

namespace {

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input) {
    const torch::Tensor u = input.contiguous();
    torch::Tensor y = torch::empty_like(u), slope = torch::empty_like(u);
    const float* in = u.data_ptr<float>();
    float *out = y.data_ptr<float>(), *d = slope.data_ptr<float>();
    ForEachRange(u.numel(), [&](int64_t begin, int64_t end) {
      gelu::GeluWithSlope(in + begin, end - begin, out + begin, d + begin);
    });
    ctx->save_for_backward({slope});
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0]};
  }
};

}  // namespace

torch::Tensor Gelu(const torch::Tensor& u) {
  const bool wants_grad = torch::GradMode::is_enabled() && u.requires_grad();
  if (!wants_grad || !u.device().is_cpu() || u.scalar_type() != torch::kFloat ||
      at::autocast::is_autocast_enabled(at::kCPU))
    return torch::gelu(u);
  return GeluFunction::apply(u);
}

torch::Tensor PositionsFromZero(const torch::Tensor& input_ids, int64_t positions) {
  const int64_t seq = input_ids.size(1);
  if (seq > positions)
    throw std::invalid_argument("sequence length " + std::to_string(seq) + " exceeds the model's " +
                                std::to_string(positions) + " positions");
  return torch::arange(seq, torch::TensorOptions().dtype(torch::kLong).device(input_ids.device())).unsqueeze(0);
}

torch::Tensor SplitHeads(const torch::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

torch::Tensor MergeHeads(const torch::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

torch::Tensor CausalKeepMask(const torch::Tensor& key_keep, int64_t queries) {
  const int64_t keys = key_keep.size(1);
  auto options = torch::TensorOptions().dtype(torch::kBool).device(key_keep.device());
  torch::Tensor earlier = torch::ones({queries, keys}, options).tril(keys - queries);
  torch::Tensor itself = earlier.logical_and(torch::ones({queries, keys}, options).triu(keys - queries));
  return key_keep.to(torch::kBool).unsqueeze(1).unsqueeze(2).logical_and(earlier).logical_or(itself);
}

namespace {

// Attention with dropout on the probabilities through ApplyDropout() (SDPA would draw its
// dropout mask with bernoulli_, see ApplyDropout()): what SDPA's math path computes.
torch::Tensor AttendWithDropout(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const std::optional<torch::Tensor>& keep, bool causal, std::optional<double> scale,
                                double dropout) {
  const double factor = scale ? *scale : 1.0 / std::sqrt(double(q.size(-1)));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * factor;
  const float lowest = -std::numeric_limits<float>::infinity();
  if (keep) scores = scores.masked_fill(keep->logical_not(), lowest);
  if (causal) {
    auto options = torch::TensorOptions().dtype(torch::kBool).device(q.device());
    scores = scores.masked_fill(torch::ones({q.size(2), k.size(2)}, options).triu(1), lowest);
  }
  return torch::matmul(ApplyDropout(scores.softmax(-1), dropout, true), v);
}

}  // namespace

torch::Tensor ScaledDotProductAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const std::optional<torch::Tensor>& mask, double dropout, bool causal,
                                        std::optional<double> scale) {
  static const bool below_avx512 = at::get_cpu_capability() != "AVX512";
  const bool reduced = q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf;
  if (below_avx512 && reduced && q.is_cpu() && at::native::cpublas::could_pack(q.scalar_type())) {
    // The math op takes an additive mask; the public SDPA converts a boolean one first.
    std::optional<torch::Tensor> additive = mask;
    if (mask && mask->scalar_type() == torch::kBool)
      additive = torch::zeros(mask->sizes(), q.options())
                     .masked_fill(mask->logical_not(), -std::numeric_limits<double>::infinity());
    return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, additive, dropout, causal, std::nullopt, scale));
  }
  return at::scaled_dot_product_attention(q, k, v, mask, dropout, causal, scale);
}

torch::Tensor MultiHeadAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t heads,
                                 const torch::Tensor& keep_mask, double dropout, bool causal,
                                 std::optional<double> scale) {
  std::optional<torch::Tensor> mask;
  if (keep_mask.defined()) mask = keep_mask;
  // SDPA refuses an explicit mask together with is_causal: fold causality into the mask.
  if (mask && causal) {
    mask = CausalKeepMask(keep_mask.squeeze(1).squeeze(1), q.size(1));
    causal = false;
  }
  if (dropout > 0 && !q.is_cuda() && q.scalar_type() == torch::kFloat)
    return MergeHeads(AttendWithDropout(SplitHeads(q, heads), SplitHeads(k, heads), SplitHeads(v, heads), mask, causal,
                                        scale, dropout));
  return MergeHeads(ScaledDotProductAttention(SplitHeads(q, heads), SplitHeads(k, heads), SplitHeads(v, heads), mask,
                                              dropout, causal, scale));
}

torch::Tensor KeyKeepMask(const torch::Tensor& attention_mask) {
  if (!attention_mask.is_cuda() && attention_mask.all().item<bool>()) return {};
  return attention_mask.to(torch::kBool).unsqueeze(1).unsqueeze(2);
}

void LoraSlot::Attach(torch::nn::Module& layer, int64_t in_features, int64_t out_features, int64_t r, double scaling,
                      double dropout) {
  a_ = layer.register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in_features, r).bias(false)));
  b_ = layer.register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(r, out_features).bias(false)));
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(a_->weight, std::sqrt(5.0));
  b_->weight.zero_();
  scaling_ = scaling;
  dropout_ = dropout;
}

torch::Tensor LoraSlot::AddTo(const torch::Tensor& y, const torch::Tensor& x, bool training) const {
  return AddLowRankUpdates(y, ApplyDropout(x, dropout_, training), {Update(0)});
}

torch::Tensor LoraSlot::DeltaWeight() const { return torch::matmul(b_->weight, a_->weight) * scaling_; }

AdaptableLinearImpl::AdaptableLinearImpl(int64_t in_features, int64_t out_features, bool with_bias)
    : torch::nn::LinearImpl(torch::nn::LinearOptions(in_features, out_features).bias(with_bias)) {}

torch::Tensor AdaptableLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y;
  if (!int8_weight.isNone())
    y = Int8Linear(x, int8_weight);
  else if (RowProductApplies(x, weight))
    y = RowsTimesWeightT(x, weight, bias);
  else if (PackedLinear::Applies(x, {weight}, {bias}))
    y = packed.Forward(x, {weight}, {bias});
  else if (ComputeDtypeWeights::Applies(x, {weight}, {bias}))
    y = cast.Forward(x, {weight}, {bias});
  else
    y = torch::nn::LinearImpl::forward(x);
  return lora.adapted() ? lora.AddTo(y, x, is_training()) : y;
}

std::optional<torch::Tensor> AdaptableLinearImpl::forward_without_bias(const torch::Tensor& x) {
  if (!int8_weight.isNone() || !bias.defined() || !x.is_cuda()) return std::nullopt;
  torch::Tensor y;
  // The cast copies of weight and bias together, so a layer's one copy serves both forms.
  if (ComputeDtypeWeights::Applies(x, {weight}, {bias})) y = cast.Current({weight}, {bias}).weight;
  y = torch::linear(x, y.defined() ? y : weight);
  return lora.adapted() ? lora.AddTo(y, x, is_training()) : y;
}

torch::Tensor DenseDropoutAddNorm(AdaptableLinear& dense, torch::nn::LayerNorm& norm, Dropout& dropout,
                                  const torch::Tensor& x, const torch::Tensor& residual, bool fused) {
  // residual stands in for the product's shape and device; its dtype is checked on the
  // product itself below.
  if (fused && FusedAddNormApplies(residual, residual, norm->weight, norm->bias, dense->bias)) {
    if (std::optional<torch::Tensor> unbiased = dense->forward_without_bias(x))
      return FusedDropoutAddNorm(*unbiased, residual, norm->weight, norm->bias, norm->options.eps(), dropout->p(),
                                 dropout->is_training(), dense->bias);
  }
  return DropoutAddNorm(norm, dropout, dense(x), residual, fused);
}

torch::Tensor DenseGelu(AdaptableLinear& dense, const torch::Tensor& x, bool fused) {
  if (fused) {
    // FusedBiasGelu() takes the composition itself where its kernels do not fit.
    if (std::optional<torch::Tensor> unbiased = dense->forward_without_bias(x))
      return FusedBiasGelu(*unbiased, dense->bias);
  }
  return Gelu(dense(x));
}

Conv1DImpl::Conv1DImpl(int64_t in_features, int64_t out_features) {
  weight = register_parameter("weight", torch::empty({in_features, out_features}).normal_(0.0, 0.02));
  bias = register_parameter("bias", torch::zeros({out_features}));
}

torch::Tensor Conv1DImpl::forward(const torch::Tensor& x) {
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(1);
  const torch::Tensor as_linear = weight.t();
  torch::Tensor y;
  if (!int8_weight.isNone()) {
    y = Int8Linear(x, int8_weight);
  } else if (RowProductApplies(x, weight)) {
    y = RowsTimesWeight(x, weight, bias);
  } else if (PackedLinear::Applies(x, {as_linear}, {bias})) {
    y = packed.Forward(x, {as_linear}, {bias});
  } else {
    // The cast copy keeps the [in, out] layout: the same addmm, on the values autocast
    // would cast to on this call.
    ComputeDtypeWeights::Copies copies;
    if (ComputeDtypeWeights::Applies(x, {weight}, {bias})) copies = cast.Current({weight}, {bias});
    y = copies.weight.defined() ? torch::addmm(copies.bias, x.reshape({-1, x.size(-1)}), copies.weight).view(out_sizes)
                                : torch::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(out_sizes);
  }
  return lora.adapted() ? lora.AddTo(y, x, is_training()) : y;
}

namespace {

// A projection whose base product can join the fused one: full precision, with a bias.
bool FusableBase(const AdaptableLinear& linear) { return linear->int8_weight.isNone() && linear->bias.defined(); }

// qkv with the LoRA updates of the adapted projections added over their columns: one
// node for all when they read the same x, one each when LoRA dropout draws its own.
torch::Tensor AddQkvAdapters(torch::Tensor qkv, const torch::Tensor& x, const std::array<AdaptableLinear*, 3>& parts,
                             bool training) {
  std::vector<LowRankUpdate> shared;
  int64_t column = 0;
  for (AdaptableLinear* part : parts) {
    const LoraSlot& lora = (*part)->lora;
    const int64_t width = (*part)->weight.size(0);
    column += width;
    if (!lora.adapted()) continue;
    if (training && lora.dropout() > 0)
      qkv = AddLowRankUpdates(qkv, ApplyDropout(x, lora.dropout(), true), {lora.Update(column - width)});
    else
      shared.push_back(lora.Update(column - width));
  }
  return AddLowRankUpdates(qkv, x, shared);
}

}  // namespace

torch::Tensor ProjectQkv(AdaptableLinear& query, AdaptableLinear& key, AdaptableLinear& value, const torch::Tensor& x,
                         FusedQkvWeights& fused) {
  // Quantized projections need their own forward; a few rows take three streaming
  // products rather than copying all three weights into one.
  if (!FusableBase(query) || !FusableBase(key) || !FusableBase(value) || RowProductApplies(x, query->weight))
    return torch::cat({query(x), key(x), value(x)}, -1);
  const std::array<torch::Tensor, 3> weights = {query->weight, key->weight, value->weight};
  const std::array<torch::Tensor, 3> biases = {query->bias, key->bias, value->bias};
  torch::Tensor qkv;
  if (PackedLinear::Applies(x, weights, biases))
    qkv = fused.packed.Forward(x, weights, biases);
  else if (ComputeDtypeWeights::Applies(x, weights, biases))
    qkv = fused.cast.Forward(x, weights, biases);
  else
    qkv = torch::linear(x, torch::cat(weights), torch::cat(biases));
  return AddQkvAdapters(std::move(qkv), x, {&query, &key, &value}, query->is_training());
}

torch::Tensor SelfAttention(const torch::Tensor& qkv, int64_t heads, const torch::Tensor& keep_mask, double dropout,
                            const TokenIndex* tokens, Rows rows) {
  if (tokens && qkv.is_cuda()) {
    const int64_t hidden = qkv.size(-1) / 3;
    const std::vector<torch::Tensor> split = qkv.reshape({qkv.size(0), 3, heads, hidden / heads}).unbind(1);
    if (TokenIndex::AttendApplies(split[0], split[1], split[2])) {
      torch::Tensor context = tokens->Attend(split[0], split[1], split[2], dropout, rows == Rows::kFirst);
      context = context.reshape({context.size(0), hidden});
      return rows == Rows::kFirst ? context.unsqueeze(1) : context;
    }
  }
  const std::vector<torch::Tensor> parts = (tokens ? tokens->Unpack(qkv) : qkv).chunk(3, -1);
  const torch::Tensor queries = rows == Rows::kFirst ? parts[0].narrow(1, 0, 1) : parts[0];
  torch::Tensor context = MultiHeadAttention(queries, parts[1], parts[2], heads, keep_mask, dropout, false);
  return tokens && rows == Rows::kAll ? tokens->Pack(context) : context;
}

torch::Tensor FirstRows(const torch::Tensor& hidden, const TokenIndex* tokens) {
  return tokens ? tokens->FirstRows(hidden) : hidden.narrow(1, 0, 1);
}

}  // namespace trainyard

namespace trainyard {

void InitHfStyle(torch::nn::Module& model, double std) {
  torch::NoGradGuard no_grad;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* conv = module->as<Conv1D>()) {
      conv->weight.normal_(0.0, std);
      conv->bias.zero_();
    } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, std);
      if (auto pad = embedding->options.padding_idx()) embedding->weight[*pad].zero_();
    } else if (auto* norm = module->as<torch::nn::LayerNorm>()) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
}

}  // namespace trainyard
