#include "worker/models/gpt2.h"

#include <cmath>

#include "worker/kernels/gemv.h"
#include "worker/models/config_fields.h"

namespace trainyard {
namespace {

// An optional id: absent or null keeps *out (-1 meaning none).
void OptionalIdField(const nlohmann::json& j, const std::string& key, int64_t vocab, int64_t* out) {
  if (!j.contains(key) || j[key].is_null()) return;
  IntField(j, key, 0, vocab - 1, out);
}

}  // namespace

nlohmann::json Gpt2PresetSizes(const std::string& preset) {
  if (preset == "tiny") return {{"n_embd", 128}, {"n_layer", 2}, {"n_head", 2}};
  if (preset == "mini") return {{"n_embd", 256}, {"n_layer", 4}, {"n_head", 4}};
  if (preset == "base" || preset == "small") return {{"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}};
  throw std::invalid_argument("unknown model preset '" + preset + "' (tiny, mini, base)");
}

Gpt2Config Gpt2Config::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("expected a JSON object");
  RequireFields(j, {"vocab_size", "n_embd", "n_layer", "n_head"});
  Gpt2Config c;
  IntField(j, "vocab_size", 1, kMaxVocab, &c.vocab_size);
  IntField(j, "n_positions", 1, kMaxPositions, &c.n_positions);
  IntField(j, "n_embd", 1, kMaxHidden, &c.n_embd);
  IntField(j, "n_layer", 1, kMaxLayers, &c.n_layer);
  IntField(j, "n_head", 1, kMaxHidden, &c.n_head);
  if (j.contains("n_inner") && !j["n_inner"].is_null()) IntField(j, "n_inner", 1, kMaxIntermediate, &c.n_inner);
  ChoiceField(j, "activation_function", {"gelu_new", "gelu_pytorch_tanh", "gelu"}, &c.activation_function);
  NumberField(j, "layer_norm_epsilon", 1e-30, 1.0, true, &c.layer_norm_epsilon);
  NumberField(j, "resid_pdrop", 0.0, 1.0, false, &c.resid_pdrop);
  NumberField(j, "embd_pdrop", 0.0, 1.0, false, &c.embd_pdrop);
  NumberField(j, "attn_pdrop", 0.0, 1.0, false, &c.attn_pdrop);
  BoolField(j, "scale_attn_weights", &c.scale_attn_weights);
  BoolField(j, "scale_attn_by_inverse_layer_idx", &c.scale_attn_by_inverse_layer_idx);
  bool tied = true;
  BoolField(j, "tie_word_embeddings", &tied);
  if (!tied) ConfigFail("tie_word_embeddings", "only GPT-2 with lm_head tied to wte is supported");
  c.bos_token_id = std::min(c.bos_token_id, c.vocab_size - 1);
  c.eos_token_id = std::min(c.eos_token_id, c.vocab_size - 1);
  OptionalIdField(j, "bos_token_id", c.vocab_size, &c.bos_token_id);
  OptionalIdField(j, "eos_token_id", c.vocab_size, &c.eos_token_id);
  OptionalIdField(j, "pad_token_id", c.vocab_size, &c.pad_token_id);
  c.labels = LabelsField(j);
  if (c.n_embd % c.n_head != 0)
    ConfigFail("n_head", std::to_string(c.n_head) + " does not divide n_embd " + std::to_string(c.n_embd));
  const double e = double(c.n_embd);
  CheckParameterCount(
      e * double(c.vocab_size + c.n_positions) + double(c.n_layer) * (4 * e * e + 2 * e * double(c.inner())), "n_embd");
  return c;
}

nlohmann::json Gpt2Config::ToJson() const {
  nlohmann::json j = {{"model_type", "gpt2"},
                      {"vocab_size", vocab_size},
                      {"n_positions", n_positions},
                      {"n_embd", n_embd},
                      {"n_layer", n_layer},
                      {"n_head", n_head},
                      {"n_inner", n_inner > 0 ? nlohmann::json(n_inner) : nlohmann::json(nullptr)},
                      {"activation_function", activation_function},
                      {"layer_norm_epsilon", layer_norm_epsilon},
                      {"resid_pdrop", resid_pdrop},
                      {"embd_pdrop", embd_pdrop},
                      {"attn_pdrop", attn_pdrop},
                      {"scale_attn_weights", scale_attn_weights},
                      {"scale_attn_by_inverse_layer_idx", scale_attn_by_inverse_layer_idx},
                      {"initializer_range", 0.02},
                      {"tie_word_embeddings", true},
                      {"bos_token_id", bos_token_id},
                      {"eos_token_id", eos_token_id}};
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  return j;
}

Gpt2BlockImpl::Gpt2BlockImpl(const Gpt2Config& c, int64_t layer_index)
    : heads_(c.n_head), attention_dropout_(c.attn_pdrop), exact_gelu_(c.activation_function == "gelu") {
  const int64_t e = c.n_embd;
  const int64_t head_size = e / c.n_head;  // the config check makes n_embd a multiple of n_head
  scale_ = c.scale_attn_weights ? 1.0 / std::sqrt(double(head_size)) : 1.0;
  if (c.scale_attn_by_inverse_layer_idx) scale_ /= double(layer_index + 1);
  ln_1_ = register_module("ln_1", MakeLayerNorm(e, c.layer_norm_epsilon));
  auto attn = Node(*this, "attn");
  c_attn_ = attn->register_module("c_attn", Conv1D(e, 3 * e));
  attn_proj_ = attn->register_module("c_proj", Conv1D(e, e));
  ln_2_ = register_module("ln_2", MakeLayerNorm(e, c.layer_norm_epsilon));
  auto mlp = Node(*this, "mlp");
  c_fc_ = mlp->register_module("c_fc", Conv1D(e, c.inner()));
  mlp_proj_ = mlp->register_module("c_proj", Conv1D(c.inner(), e));
  resid_dropout_ = register_module("resid_dropout", Dropout(c.resid_pdrop));
}

torch::Tensor Gpt2BlockImpl::Mlp(const torch::Tensor& x) {
  torch::Tensor inner = c_fc_(x);
  return mlp_proj_(exact_gelu_ ? torch::gelu(inner) : torch::gelu(inner, "tanh"));
}

torch::Tensor Gpt2BlockImpl::forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask) {
  std::vector<torch::Tensor> qkv = c_attn_(ln_1_(hidden)).chunk(3, /*dim=*/2);
  torch::Tensor context = MultiHeadAttention(qkv[0], qkv[1], qkv[2], heads_, keep_mask,
                                             is_training() ? attention_dropout_ : 0.0, /*causal=*/true, scale_);
  torch::Tensor x = hidden + resid_dropout_(attn_proj_(context));
  return x + resid_dropout_(Mlp(ln_2_(x)));
}

torch::Tensor Gpt2BlockImpl::Step(const torch::Tensor& hidden, const torch::Tensor& mask, bool causal, KvCache& cache,
                                  int64_t layer) {
  std::vector<torch::Tensor> qkv = c_attn_(ln_1_(hidden)).chunk(3, /*dim=*/2);
  auto [keys, values] = cache.Append(layer, SplitHeads(qkv[1], heads_), SplitHeads(qkv[2], heads_));
  std::optional<torch::Tensor> keep;
  if (mask.defined()) keep = mask;
  torch::Tensor context =
      MergeHeads(ScaledDotProductAttention(SplitHeads(qkv[0], heads_), keys, values, keep, 0.0, causal, scale_));
  torch::Tensor x = hidden + resid_dropout_(attn_proj_(context));
  return x + resid_dropout_(Mlp(ln_2_(x)));
}

Gpt2ModelImpl::Gpt2ModelImpl(const Gpt2Config& c) : config_(c) {
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.n_positions, c.n_embd));
  drop_ = register_module("drop", Dropout(c.embd_pdrop));
  auto h = Node(*this, "h");
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_.push_back(h->register_module(std::to_string(i), Gpt2Block(c, i)));
  ln_f_ = register_module("ln_f", MakeLayerNorm(c.n_embd, c.layer_norm_epsilon));
}

torch::Tensor Gpt2ModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  torch::Tensor positions = PositionsFromZero(input_ids, config_.n_positions);
  torch::Tensor hidden = drop_(wte_(input_ids) + wpe_(positions));
  const torch::Tensor keep_mask = KeyKeepMask(attention_mask);
  for (auto& block : blocks_) hidden = block->forward(hidden, keep_mask);
  return ln_f_(hidden);
}

torch::Tensor Gpt2ModelImpl::Step(const torch::Tensor& ids, const torch::Tensor& positions,
                                  const torch::Tensor& key_keep, KvCache& cache) {
  const int64_t end = cache.fixed_shape() ? cache.capacity() : cache.length() + ids.size(1);
  if (end > config_.n_positions)
    throw std::invalid_argument(std::to_string(end) + " tokens exceed the model's " +
                                std::to_string(config_.n_positions) + " positions");
  torch::Tensor hidden = drop_(wte_(ids) + wpe_(positions));
  if (cache.fixed_shape()) {  // key_keep covers the whole cache: the mask as it is
    const torch::Tensor mask = key_keep.to(torch::kBool).unsqueeze(1).unsqueeze(2);
    for (size_t i = 0; i < blocks_.size(); ++i) hidden = blocks_[i]->Step(hidden, mask, false, cache, int64_t(i));
    return ln_f_(hidden);
  }
  // Without padding no mask is needed: a single new position may attend every cached
  // key, and a prefill into an empty cache is plain causal attention, which SDPA runs
  // in its fused kernels (an explicit mask sends CPU SDPA down its reference path).
  // Checked on the CPU only: on a GPU the check would stall the stream.
  const bool no_padding = !key_keep.is_cuda() && key_keep.all().item<bool>();
  const bool maskless = no_padding && (ids.size(1) == 1 || cache.length() == 0);
  const torch::Tensor mask = maskless ? torch::Tensor() : CausalKeepMask(key_keep, ids.size(1));
  const bool causal = maskless && ids.size(1) > 1;
  for (size_t i = 0; i < blocks_.size(); ++i) hidden = blocks_[i]->Step(hidden, mask, causal, cache, int64_t(i));
  cache.Advance(ids.size(1));
  return ln_f_(hidden);
}

void InitGpt2Weights(torch::nn::Module& model, int64_t n_layer) {
  InitHfStyle(model, 0.02);
  torch::NoGradGuard no_grad;
  const std::string residual = "c_proj.weight";
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    if (name.size() >= residual.size() && name.compare(name.size() - residual.size(), residual.size(), residual) == 0)
      item.value().normal_(0.0, 0.02 / std::sqrt(2.0 * double(n_layer)));
  }
}

Gpt2LMHeadModelImpl::Gpt2LMHeadModelImpl(Gpt2Config config) : config_(std::move(config)) {
  transformer_ = register_module("transformer", Gpt2Model(config_));
  info_ = {ModelFamily::kGpt2, ModelTask::kCausalLm, config_.vocab_size, config_.n_positions, config_.pad_token_id, {}};
  InitWeights();
}

torch::Tensor Gpt2LMHeadModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  return Head(transformer_->forward(input_ids, attention_mask));
}

torch::Tensor Gpt2LMHeadModelImpl::Head(const torch::Tensor& hidden) {
  const torch::Tensor& wte = transformer_->token_embedding();
  ComputeDtypeWeights::Copies copies;
  if (ComputeDtypeWeights::Applies(hidden, {wte}, {torch::Tensor()}))
    copies = head_cast_.Current({wte}, {torch::Tensor()});
  return torch::matmul(hidden, (copies.weight.defined() ? copies.weight : wte).t());
}

torch::Tensor Gpt2LMHeadModelImpl::Step(const torch::Tensor& ids, const torch::Tensor& positions,
                                        const torch::Tensor& key_keep, KvCache& cache, bool last_only) {
  torch::Tensor hidden = transformer_->Step(ids, positions, key_keep, cache);
  if (last_only) hidden = hidden.narrow(1, hidden.size(1) - 1, 1);
  const torch::Tensor& wte = transformer_->token_embedding();
  return RowProductApplies(hidden, wte) ? RowsTimesWeightT(hidden, wte, {}) : Head(hidden);
}

KvCache Gpt2LMHeadModelImpl::NewCache(int64_t batch, int64_t capacity, torch::ScalarType dtype) const {
  const torch::Tensor& wte = transformer_->token_embedding();
  return KvCache(config_.n_layer, batch, config_.n_head, capacity, config_.n_embd / config_.n_head,
                 wte.options().dtype(dtype));
}

nlohmann::json Gpt2LMHeadModelImpl::HfConfig() const {
  nlohmann::json j = config_.ToJson();
  j["architectures"] = {"GPT2LMHeadModel"};
  return j;
}

Gpt2ForSequenceClassificationImpl::Gpt2ForSequenceClassificationImpl(Gpt2Config config) : config_(std::move(config)) {
  transformer_ = register_module("transformer", Gpt2Model(config_));
  score_ =
      register_module("score", AdaptableLinear(config_.n_embd, int64_t(config_.labels.size()), /*with_bias=*/false));
  info_ = {ModelFamily::kGpt2,   ModelTask::kSequenceClassification,
           config_.vocab_size,   config_.n_positions,
           config_.pad_token_id, config_.labels};
  InitWeights();
}

torch::Tensor Gpt2ForSequenceClassificationImpl::forward(const torch::Tensor& input_ids,
                                                         const torch::Tensor& attention_mask) {
  torch::Tensor hidden = transformer_->forward(input_ids, attention_mask);
  const int64_t batch = input_ids.size(0);
  torch::Tensor last;
  if (config_.pad_token_id < 0) {
    if (batch != 1) throw std::invalid_argument("GPT-2 classification of a batch needs a pad_token_id in config.json");
    last = torch::full({1}, input_ids.size(1) - 1, input_ids.options());
  } else {
    torch::Tensor positions = torch::arange(input_ids.size(1), input_ids.options());
    last = (positions * input_ids.ne(config_.pad_token_id).to(torch::kLong)).argmax(-1);
  }
  torch::Tensor pooled = hidden.index({torch::arange(batch, input_ids.options()), last});
  return score_(pooled);
}

nlohmann::json Gpt2ForSequenceClassificationImpl::HfConfig() const {
  nlohmann::json j = config_.ToJson();
  j["architectures"] = {"GPT2ForSequenceClassification"};
  PutLabels(config_.labels, &j);
  return j;
}

Model CreateGpt2(const nlohmann::json& config, ModelTask task) {
  Gpt2Config c = Gpt2Config::FromJson(config);
  if (task == ModelTask::kCausalLm) return std::make_shared<Gpt2LMHeadModelImpl>(std::move(c));
  return std::make_shared<Gpt2ForSequenceClassificationImpl>(std::move(c));
}

}  // namespace trainyard
