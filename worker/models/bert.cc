#include "worker/models/bert.h"

#include <cstdint>
#include <optional>
#include <stdexcept>

#include "worker/models/config_fields.h"
#include "worker/models/layers.h"

namespace trainyard {
namespace {

void CheckConsistent(const BertConfig& c) {
  if (c.hidden_size % c.num_attention_heads != 0)
    ConfigFail("num_attention_heads",
               std::to_string(c.num_attention_heads) + " does not divide hidden_size " + std::to_string(c.hidden_size));
  if (c.pad_token_id >= c.vocab_size)
    ConfigFail("pad_token_id",
               std::to_string(c.pad_token_id) + " is not below vocab_size " + std::to_string(c.vocab_size));
  const double h = double(c.hidden_size);
  CheckParameterCount(h * double(c.vocab_size + c.max_position_embeddings + c.type_vocab_size) +
                          double(c.num_hidden_layers) * (4 * h * h + 2 * h * double(c.intermediate_size)),
                      "hidden_size");
}

}  // namespace

nlohmann::json BertPresetSizes(const std::string& preset) {
  if (preset == "tiny")
    return {{"hidden_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"intermediate_size", 512}};
  if (preset == "mini")
    return {{"hidden_size", 256}, {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"intermediate_size", 1024}};
  if (preset == "base")
    return {{"hidden_size", 768}, {"num_hidden_layers", 12}, {"num_attention_heads", 12}, {"intermediate_size", 3072}};
  throw std::invalid_argument("unknown model preset '" + preset + "' (tiny, mini, base)");
}

BertConfig BertConfig::FromJson(const nlohmann::json& j, BertConfig c) {
  if (!j.is_object()) throw std::runtime_error("expected a JSON object");
  RequireFields(j, {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"});
  IntField(j, "vocab_size", 1, kMaxVocab, &c.vocab_size);
  IntField(j, "hidden_size", 1, kMaxHidden, &c.hidden_size);
  IntField(j, "num_hidden_layers", 1, kMaxLayers, &c.num_hidden_layers);
  IntField(j, "num_attention_heads", 1, kMaxHidden, &c.num_attention_heads);
  IntField(j, "intermediate_size", 1, kMaxIntermediate, &c.intermediate_size);
  IntField(j, "max_position_embeddings", 1, kMaxPositions, &c.max_position_embeddings);
  IntField(j, "type_vocab_size", 1, kMaxTypeVocab, &c.type_vocab_size);
  IntField(j, "pad_token_id", 0, kMaxVocab, &c.pad_token_id);
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null())
    IntField(j, "bos_token_id", 0, kMaxVocab, &c.bos_token_id);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null())
    IntField(j, "eos_token_id", 0, kMaxVocab, &c.eos_token_id);
  NumberField(j, "hidden_dropout_prob", 0.0, 1.0, false, &c.hidden_dropout_prob);
  NumberField(j, "attention_probs_dropout_prob", 0.0, 1.0, false, &c.attention_probs_dropout_prob);
  if (j.contains("classifier_dropout") && !j["classifier_dropout"].is_null())
    NumberField(j, "classifier_dropout", 0.0, 1.0, false, &c.classifier_dropout);
  NumberField(j, "layer_norm_eps", 1e-30, 1.0, true, &c.layer_norm_eps);
  if (j.contains("hidden_act") && j["hidden_act"] != "gelu") ConfigFail("hidden_act", "must be 'gelu'");
  if (j.contains("position_embedding_type") && j["position_embedding_type"] != "absolute")
    ConfigFail("position_embedding_type", "must be 'absolute'");
  c.labels = LabelsField(j);
  CheckConsistent(c);
  return c;
}

nlohmann::json BertConfig::ToJson() const {
  nlohmann::json j = {{"vocab_size", vocab_size},
                      {"hidden_size", hidden_size},
                      {"num_hidden_layers", num_hidden_layers},
                      {"num_attention_heads", num_attention_heads},
                      {"intermediate_size", intermediate_size},
                      {"hidden_act", "gelu"},
                      {"hidden_dropout_prob", hidden_dropout_prob},
                      {"attention_probs_dropout_prob", attention_probs_dropout_prob},
                      {"max_position_embeddings", max_position_embeddings},
                      {"type_vocab_size", type_vocab_size},
                      {"initializer_range", 0.02},
                      {"layer_norm_eps", layer_norm_eps},
                      {"pad_token_id", pad_token_id},
                      {"position_embedding_type", "absolute"}};
  j["classifier_dropout"] = classifier_dropout >= 0 ? nlohmann::json(classifier_dropout) : nlohmann::json(nullptr);
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  PutLabels(labels, &j);
  return j;
}

BertLayerImpl::BertLayerImpl(const BertConfig& c)
    : heads_(c.num_attention_heads), attention_dropout_(c.attention_probs_dropout_prob) {
  const int64_t h = c.hidden_size;
  auto attention = Node(*this, "attention");
  auto self = Node(*attention, "self");
  query_ = self->register_module("query", AdaptableLinear(h, h));
  key_ = self->register_module("key", AdaptableLinear(h, h));
  value_ = self->register_module("value", AdaptableLinear(h, h));
  auto attention_output = Node(*attention, "output");
  attention_out_ = attention_output->register_module("dense", AdaptableLinear(h, h));
  attention_norm_ = attention_output->register_module("LayerNorm", MakeLayerNorm(h, c.layer_norm_eps));
  intermediate_ = Node(*this, "intermediate")->register_module("dense", AdaptableLinear(h, c.intermediate_size));
  auto output = Node(*this, "output");
  output_ = output->register_module("dense", AdaptableLinear(c.intermediate_size, h));
  output_norm_ = output->register_module("LayerNorm", MakeLayerNorm(h, c.layer_norm_eps));
  dropout_ = register_module("dropout", Dropout(c.hidden_dropout_prob));
}

torch::Tensor BertLayerImpl::forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask,
                                     const TokenIndex* tokens, Rows rows) {
  torch::Tensor context = SelfAttention(ProjectQkv(query_, key_, value_, hidden, qkv_fused_), heads_, keep_mask,
                                        is_training() ? attention_dropout_ : 0.0, tokens, rows);
  const torch::Tensor residual = rows == Rows::kFirst ? FirstRows(hidden, tokens) : hidden;
  torch::Tensor attended =
      DenseDropoutAddNorm(attention_out_, attention_norm_, dropout_, context, residual, fused_add_norm_);
  torch::Tensor expanded = DenseGelu(intermediate_, attended, fused_add_norm_);
  return DenseDropoutAddNorm(output_, output_norm_, dropout_, expanded, attended, fused_add_norm_);
}

BertEncoderImpl::BertEncoderImpl(const BertConfig& c, PositionIds positions, bool with_pooler)
    : config_(c), positions_(positions) {
  auto embeddings = Node(*this, "embeddings");
  word_embeddings_ = embeddings->register_module(
      "word_embeddings",
      torch::nn::Embedding(torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size).padding_idx(c.pad_token_id)));
  auto position_options = torch::nn::EmbeddingOptions(c.max_position_embeddings, c.hidden_size);
  if (positions == PositionIds::kAfterPadding) position_options.padding_idx(c.pad_token_id);
  position_embeddings_ = embeddings->register_module("position_embeddings", torch::nn::Embedding(position_options));
  token_type_embeddings_ =
      embeddings->register_module("token_type_embeddings", torch::nn::Embedding(c.type_vocab_size, c.hidden_size));
  embedding_norm_ = embeddings->register_module("LayerNorm", MakeLayerNorm(c.hidden_size, c.layer_norm_eps));
  auto layer_list = Node(*Node(*this, "encoder"), "layer");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers_.push_back(layer_list->register_module(std::to_string(i), BertLayer(c)));
  if (with_pooler)
    pooler_ = Node(*this, "pooler")->register_module("dense", AdaptableLinear(c.hidden_size, c.hidden_size));
  dropout_ = register_module("dropout", Dropout(c.hidden_dropout_prob));
}

int64_t BertEncoderImpl::max_sequence() const {
  if (positions_ == PositionIds::kFromZero) return config_.max_position_embeddings;
  return config_.max_position_embeddings - config_.pad_token_id - 1;
}

torch::Tensor BertEncoderImpl::PositionIdsOf(const torch::Tensor& input_ids) const {
  torch::Tensor from_zero = PositionsFromZero(input_ids, max_sequence());  // also checks the length
  if (positions_ == PositionIds::kFromZero) return from_zero;
  // HF's create_position_ids_from_input_ids: from the ids, not the attention mask.
  torch::Tensor real = input_ids.ne(config_.pad_token_id).to(torch::kLong);
  return real.cumsum(1) * real + config_.pad_token_id;
}

torch::Tensor BertEncoderImpl::Embed(const torch::Tensor& input_ids, const TokenIndex* tokens) {
  torch::Tensor ids = input_ids, positions = PositionIdsOf(input_ids);
  if (tokens) {
    ids = tokens->Pack(input_ids);
    positions = tokens->Pack(positions.expand_as(input_ids));
  }
  return word_embeddings_(ids) + token_type_embeddings_(torch::zeros_like(ids)) + position_embeddings_(positions);
}

torch::Tensor BertEncoderImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                       Unpadding unpadding, Rows rows, const TokenPacking* packing) {
  const torch::Tensor keep_mask = KeyKeepMask(attention_mask);
  const std::optional<TokenIndex> tokens = TokensToRun(packing, unpadding, attention_mask, keep_mask);
  const TokenIndex* packed = tokens ? &*tokens : nullptr;
  torch::Tensor hidden = dropout_(embedding_norm_(Embed(input_ids, packed)));
  for (size_t i = 0; i < layers_.size(); ++i)
    hidden = layers_[i]->forward(hidden, keep_mask, packed, i + 1 == layers_.size() ? rows : Rows::kAll);
  if (rows == Rows::kFirst && layers_.empty()) return FirstRows(hidden, packed);
  return tokens && rows == Rows::kAll ? tokens->Unpack(hidden) : hidden;
}

torch::Tensor BertEncoderImpl::Pool(const torch::Tensor& hidden) { return torch::tanh(pooler_(hidden.select(1, 0))); }

BertForSequenceClassificationImpl::BertForSequenceClassificationImpl(BertConfig config) : config_(std::move(config)) {
  const BertConfig& c = config_;
  bert_ = register_module("bert", BertEncoder(c, PositionIds::kFromZero, /*with_pooler=*/true));
  classifier_ = register_module("classifier", AdaptableLinear(c.hidden_size, c.num_labels()));
  dropout_ = register_module("dropout", Dropout(c.ClassifierDropout()));
  info_ = {ModelFamily::kBert, ModelTask::kSequenceClassification,
           c.vocab_size,       bert_->max_sequence(),
           c.pad_token_id,     c.labels};
  InitWeights();
}

void BertForSequenceClassificationImpl::InitWeights() { InitHfStyle(*this, 0.02); }

nlohmann::json BertForSequenceClassificationImpl::HfConfig() const {
  nlohmann::json j = config_.ToJson();
  j["architectures"] = {"BertForSequenceClassification"};
  j["model_type"] = "bert";
  return j;
}

torch::Tensor BertForSequenceClassificationImpl::Classify(const torch::Tensor& input_ids,
                                                          const torch::Tensor& attention_mask,
                                                          const TokenPacking* packing) {
  return classifier_(
      dropout_(bert_->Pool(bert_->forward(input_ids, attention_mask, unpadding(), head_rows(), packing))));
}

Model CreateBert(const nlohmann::json& config, ModelTask task) {
  if (task != ModelTask::kSequenceClassification)
    ConfigFail("model_type", std::string("bert has no ") + TaskName(task) + " model here");
  return std::make_shared<BertForSequenceClassificationImpl>(BertConfig::FromJson(config));
}

}  // namespace trainyard
