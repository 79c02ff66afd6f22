#include "worker/models/distilbert.h"

#include <optional>

#include "worker/models/config_fields.h"
#include "worker/models/layers.h"

namespace trainyard {
namespace {

constexpr double kLayerNormEps = 1e-12;  // HF's DistilBERT hard-codes it; config.json has none

}  // namespace

nlohmann::json DistilBertPresetSizes(const std::string& preset) {
  if (preset == "tiny") return {{"dim", 128}, {"n_layers", 2}, {"n_heads", 2}, {"hidden_dim", 512}};
  if (preset == "mini") return {{"dim", 256}, {"n_layers", 4}, {"n_heads", 4}, {"hidden_dim", 1024}};
  if (preset == "base") return {{"dim", 768}, {"n_layers", 6}, {"n_heads", 12}, {"hidden_dim", 3072}};
  throw std::invalid_argument("unknown model preset '" + preset + "' (tiny, mini, base)");
}

DistilBertConfig DistilBertConfig::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("expected a JSON object");
  RequireFields(j, {"vocab_size", "dim", "n_layers", "n_heads"});
  DistilBertConfig c;
  IntField(j, "vocab_size", 1, kMaxVocab, &c.vocab_size);
  IntField(j, "dim", 1, kMaxHidden, &c.dim);
  IntField(j, "n_layers", 1, kMaxLayers, &c.n_layers);
  IntField(j, "n_heads", 1, kMaxHidden, &c.n_heads);
  IntField(j, "hidden_dim", 1, kMaxIntermediate, &c.hidden_dim);
  IntField(j, "max_position_embeddings", 1, kMaxPositions, &c.max_position_embeddings);
  IntField(j, "pad_token_id", 0, kMaxVocab, &c.pad_token_id);
  NumberField(j, "dropout", 0.0, 1.0, false, &c.dropout);
  NumberField(j, "attention_dropout", 0.0, 1.0, false, &c.attention_dropout);
  NumberField(j, "seq_classif_dropout", 0.0, 1.0, false, &c.seq_classif_dropout);
  if (j.contains("activation") && j["activation"] != "gelu") ConfigFail("activation", "must be 'gelu'");
  if (j.value("sinusoidal_pos_embds", false) == true)
    ConfigFail("sinusoidal_pos_embds", "sinusoidal position tables are not supported (learned ones are)");
  c.labels = LabelsField(j);
  if (c.dim % c.n_heads != 0)
    ConfigFail("n_heads", std::to_string(c.n_heads) + " does not divide dim " + std::to_string(c.dim));
  if (c.pad_token_id >= c.vocab_size)
    ConfigFail("pad_token_id",
               std::to_string(c.pad_token_id) + " is not below vocab_size " + std::to_string(c.vocab_size));
  const double d = double(c.dim);
  CheckParameterCount(d * double(c.vocab_size + c.max_position_embeddings) +
                          double(c.n_layers) * (4 * d * d + 2 * d * double(c.hidden_dim)),
                      "dim");
  return c;
}

nlohmann::json DistilBertConfig::ToJson() const {
  nlohmann::json j = {{"architectures", {"DistilBertForSequenceClassification"}},
                      {"model_type", "distilbert"},
                      {"vocab_size", vocab_size},
                      {"dim", dim},
                      {"n_layers", n_layers},
                      {"n_heads", n_heads},
                      {"hidden_dim", hidden_dim},
                      {"max_position_embeddings", max_position_embeddings},
                      {"sinusoidal_pos_embds", false},
                      {"activation", "gelu"},
                      {"dropout", dropout},
                      {"attention_dropout", attention_dropout},
                      {"seq_classif_dropout", seq_classif_dropout},
                      {"initializer_range", 0.02},
                      {"pad_token_id", pad_token_id}};
  PutLabels(labels, &j);
  return j;
}

DistilBertLayerImpl::DistilBertLayerImpl(const DistilBertConfig& c)
    : heads_(c.n_heads), attention_dropout_(c.attention_dropout) {
  auto attention = Node(*this, "attention");
  q_lin_ = attention->register_module("q_lin", AdaptableLinear(c.dim, c.dim));
  k_lin_ = attention->register_module("k_lin", AdaptableLinear(c.dim, c.dim));
  v_lin_ = attention->register_module("v_lin", AdaptableLinear(c.dim, c.dim));
  out_lin_ = attention->register_module("out_lin", AdaptableLinear(c.dim, c.dim));
  sa_layer_norm_ = register_module("sa_layer_norm", MakeLayerNorm(c.dim, kLayerNormEps));
  auto ffn = Node(*this, "ffn");
  lin1_ = ffn->register_module("lin1", AdaptableLinear(c.dim, c.hidden_dim));
  lin2_ = ffn->register_module("lin2", AdaptableLinear(c.hidden_dim, c.dim));
  output_layer_norm_ = register_module("output_layer_norm", MakeLayerNorm(c.dim, kLayerNormEps));
  dropout_ = register_module("dropout", Dropout(c.dropout));
}

// HF's TransformerBlock: no dropout on out_lin's output, dropout after the FFN.
torch::Tensor DistilBertLayerImpl::forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask,
                                           const TokenIndex* tokens, Rows rows) {
  torch::Tensor context = SelfAttention(ProjectQkv(q_lin_, k_lin_, v_lin_, hidden, qkv_fused_), heads_, keep_mask,
                                        is_training() ? attention_dropout_ : 0.0, tokens, rows);
  const torch::Tensor residual = rows == Rows::kFirst ? FirstRows(hidden, tokens) : hidden;
  torch::Tensor attended = sa_layer_norm_(out_lin_(context) + residual);
  torch::Tensor ffn = dropout_(lin2_(Gelu(lin1_(attended))));
  return output_layer_norm_(ffn + attended);
}

DistilBertForSequenceClassificationImpl::DistilBertForSequenceClassificationImpl(DistilBertConfig config)
    : config_(std::move(config)) {
  const DistilBertConfig& c = config_;
  auto distilbert = Node(*this, "distilbert");
  auto embeddings = Node(*distilbert, "embeddings");
  word_embeddings_ = embeddings->register_module(
      "word_embeddings",
      torch::nn::Embedding(torch::nn::EmbeddingOptions(c.vocab_size, c.dim).padding_idx(c.pad_token_id)));
  position_embeddings_ =
      embeddings->register_module("position_embeddings", torch::nn::Embedding(c.max_position_embeddings, c.dim));
  embedding_norm_ = embeddings->register_module("LayerNorm", MakeLayerNorm(c.dim, kLayerNormEps));
  auto layer_list = Node(*Node(*distilbert, "transformer"), "layer");
  for (int64_t i = 0; i < c.n_layers; ++i)
    layers_.push_back(layer_list->register_module(std::to_string(i), DistilBertLayer(c)));
  pre_classifier_ = register_module("pre_classifier", AdaptableLinear(c.dim, c.dim));
  classifier_ = register_module("classifier", AdaptableLinear(c.dim, int64_t(c.labels.size())));
  dropout_ = register_module("dropout", Dropout(c.dropout));
  classifier_dropout_ = register_module("classifier_dropout", Dropout(c.seq_classif_dropout));
  info_ = {ModelFamily::kDistilBert,
           ModelTask::kSequenceClassification,
           c.vocab_size,
           c.max_position_embeddings,
           c.pad_token_id,
           c.labels};
  InitWeights();
}

void DistilBertForSequenceClassificationImpl::InitWeights() { InitHfStyle(*this, 0.02); }

nlohmann::json DistilBertForSequenceClassificationImpl::HfConfig() const { return config_.ToJson(); }

torch::Tensor DistilBertForSequenceClassificationImpl::Classify(const torch::Tensor& input_ids,
                                                                const torch::Tensor& attention_mask,
                                                                const TokenPacking* packing) {
  torch::Tensor ids = input_ids, positions = PositionsFromZero(input_ids, config_.max_position_embeddings);
  const torch::Tensor keep_mask = KeyKeepMask(attention_mask);
  const std::optional<TokenIndex> tokens = TokensToRun(packing, unpadding(), attention_mask, keep_mask);
  const TokenIndex* packed = tokens ? &*tokens : nullptr;
  if (packed) {
    ids = packed->Pack(input_ids);
    positions = packed->Pack(positions.expand_as(input_ids));
  }
  torch::Tensor hidden = dropout_(embedding_norm_(word_embeddings_(ids) + position_embeddings_(positions)));
  // The head reads position 0 alone: the last layer computes no other (head_rows()).
  for (size_t i = 0; i < layers_.size(); ++i)
    hidden = layers_[i]->forward(hidden, keep_mask, packed, i + 1 == layers_.size() ? head_rows() : Rows::kAll);
  if (layers_.empty()) hidden = FirstRows(hidden, packed);
  torch::Tensor pooled = torch::relu(pre_classifier_(hidden.select(1, 0)));
  return classifier_(classifier_dropout_(pooled));
}

Model CreateDistilBert(const nlohmann::json& config, ModelTask task) {
  if (task != ModelTask::kSequenceClassification)
    ConfigFail("model_type", std::string("distilbert has no ") + TaskName(task) + " model here");
  return std::make_shared<DistilBertForSequenceClassificationImpl>(DistilBertConfig::FromJson(config));
}

}  // namespace trainyard
