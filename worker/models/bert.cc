#include "worker/models/bert.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace trainyard {
namespace {

// A plain node that only exists to give its children HF's dotted names.
std::shared_ptr<torch::nn::Module> Node(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

torch::nn::LayerNorm MakeNorm(const BertConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps));
}

}  // namespace

BertConfig BertConfig::Preset(const std::string& name, int64_t vocab_size, std::vector<std::string> labels,
                              int64_t max_positions) {
  BertConfig c;
  if (name == "tiny") {
    c.hidden_size = 128, c.num_hidden_layers = 2, c.num_attention_heads = 2, c.intermediate_size = 512;
  } else if (name == "mini") {
    c.hidden_size = 256, c.num_hidden_layers = 4, c.num_attention_heads = 4, c.intermediate_size = 1024;
  } else if (name != "base") {
    throw std::invalid_argument("unknown model preset '" + name + "' (tiny, mini, base)");
  }
  c.vocab_size = vocab_size;
  c.max_position_embeddings = std::max<int64_t>(max_positions, 8);
  c.labels = std::move(labels);
  return c;
}

namespace {

// Bounds of config.json's sizes: every released BERT fits with room to spare, and a
// model within them cannot overflow an int64 shape or take the machine's memory.
constexpr int64_t kMaxVocab = 1'000'000, kMaxHidden = 16'384, kMaxLayers = 256, kMaxIntermediate = 65'536;
constexpr int64_t kMaxPositions = 65'536, kMaxTypeVocab = 1'024, kMaxLabels = 100'000;
constexpr double kMaxParameters = 1e10;

[[noreturn]] void ConfigFail(const std::string& key, const std::string& problem) {
  throw std::runtime_error("field '" + key + "': " + problem);
}

// An integer field (JSON integer, not 2.5 nor "2") in [lo, hi]; absent keeps *out.
void IntField(const nlohmann::json& j, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
  if (!v.is_number_integer() || too_big) ConfigFail(key, "expected an integer, got " + v.dump().substr(0, 40));
  const auto value = v.get<int64_t>();
  if (value < lo || value > hi)
    ConfigFail(key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(value));
  *out = value;
}

// A finite number in [lo, hi) (or [lo, hi] with `closed`); absent keeps *out.
void NumberField(const nlohmann::json& j, const std::string& key, double lo, double hi, bool closed, double* out) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    ConfigFail(key, "expected a finite number, got " + v.dump().substr(0, 40));
  const double value = v.get<double>();
  if (value < lo || value > hi || (!closed && value == hi))
    ConfigFail(key, "expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + (closed ? "]" : ")") +
                        ", got " + v.dump());
  *out = value;
}

// id2label: keys "0".."n-1", each once, values strings.
std::vector<std::string> Labels(const nlohmann::json& j) {
  if (j.contains("id2label") && j["id2label"].is_object() && !j["id2label"].empty()) {
    const nlohmann::json& map = j["id2label"];
    if (map.size() > size_t(kMaxLabels)) ConfigFail("id2label", "more than " + std::to_string(kMaxLabels) + " labels");
    std::vector<std::string> labels(map.size());
    std::vector<bool> seen(map.size(), false);
    for (const auto& [id, name] : map.items()) {
      size_t index = 0;
      auto [end, error] = std::from_chars(id.data(), id.data() + id.size(), index);
      if (id.empty() || error != std::errc() || end != id.data() + id.size() || index >= labels.size() || seen[index])
        ConfigFail("id2label", "ids must be 0.." + std::to_string(labels.size() - 1) + ", each once; got '" +
                                   id.substr(0, 40) + "'");
      if (!name.is_string()) ConfigFail("id2label", "label " + id + " is not a string");
      labels[index] = name.get<std::string>();
      seen[index] = true;
    }
    return labels;
  }
  int64_t n = 2;
  IntField(j, "num_labels", 1, kMaxLabels, &n);
  std::vector<std::string> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back("LABEL_" + std::to_string(i));
  return labels;
}

void CheckConsistent(const BertConfig& c) {
  if (c.hidden_size % c.num_attention_heads != 0)
    ConfigFail("num_attention_heads",
               std::to_string(c.num_attention_heads) + " does not divide hidden_size " + std::to_string(c.hidden_size));
  if (c.pad_token_id >= c.vocab_size)
    ConfigFail("pad_token_id",
               std::to_string(c.pad_token_id) + " is not below vocab_size " + std::to_string(c.vocab_size));
  const double h = double(c.hidden_size);
  const double parameters = h * double(c.vocab_size + c.max_position_embeddings + c.type_vocab_size) +
                            double(c.num_hidden_layers) * (4 * h * h + 2 * h * double(c.intermediate_size));
  if (parameters > kMaxParameters)
    ConfigFail("hidden_size", "the sizes make " + std::to_string(int64_t(parameters / 1e6)) +
                                  " million parameters, more than the cap of " +
                                  std::to_string(int64_t(kMaxParameters / 1e6)) + " million");
}

}  // namespace

BertConfig BertConfig::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("expected a JSON object");
  for (const char* required : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"})
    if (!j.contains(required)) ConfigFail(required, "missing");
  BertConfig c;
  IntField(j, "vocab_size", 1, kMaxVocab, &c.vocab_size);
  IntField(j, "hidden_size", 1, kMaxHidden, &c.hidden_size);
  IntField(j, "num_hidden_layers", 1, kMaxLayers, &c.num_hidden_layers);
  IntField(j, "num_attention_heads", 1, kMaxHidden, &c.num_attention_heads);
  IntField(j, "intermediate_size", 1, kMaxIntermediate, &c.intermediate_size);
  IntField(j, "max_position_embeddings", 1, kMaxPositions, &c.max_position_embeddings);
  IntField(j, "type_vocab_size", 1, kMaxTypeVocab, &c.type_vocab_size);
  IntField(j, "pad_token_id", 0, kMaxVocab, &c.pad_token_id);
  NumberField(j, "hidden_dropout_prob", 0.0, 1.0, false, &c.hidden_dropout_prob);
  NumberField(j, "attention_probs_dropout_prob", 0.0, 1.0, false, &c.attention_probs_dropout_prob);
  NumberField(j, "layer_norm_eps", 1e-30, 1.0, true, &c.layer_norm_eps);
  if (j.contains("hidden_act") && j["hidden_act"] != "gelu") ConfigFail("hidden_act", "must be 'gelu'");
  c.labels = Labels(j);
  CheckConsistent(c);
  return c;
}

nlohmann::json BertConfig::ToJson() const {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (size_t i = 0; i < labels.size(); ++i) {
    id2label[std::to_string(i)] = labels[i];
    label2id[labels[i]] = i;
  }
  return {{"architectures", {"BertForSequenceClassification"}},
          {"model_type", "bert"},
          {"vocab_size", vocab_size},
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
          {"position_embedding_type", "absolute"},
          {"id2label", id2label},
          {"label2id", label2id}};
}

BertLayerImpl::BertLayerImpl(const BertConfig& c)
    : heads_(c.num_attention_heads),
      head_dim_(c.hidden_size / c.num_attention_heads),
      attention_dropout_(c.attention_probs_dropout_prob) {
  const int64_t h = c.hidden_size;
  auto attention = Node(*this, "attention");
  auto self = Node(*attention, "self");
  query_ = self->register_module("query", torch::nn::Linear(h, h));
  key_ = self->register_module("key", torch::nn::Linear(h, h));
  value_ = self->register_module("value", torch::nn::Linear(h, h));
  auto attention_output = Node(*attention, "output");
  attention_out_ = attention_output->register_module("dense", torch::nn::Linear(h, h));
  attention_norm_ = attention_output->register_module("LayerNorm", MakeNorm(c));
  intermediate_ = Node(*this, "intermediate")->register_module("dense", torch::nn::Linear(h, c.intermediate_size));
  auto output = Node(*this, "output");
  output_ = output->register_module("dense", torch::nn::Linear(c.intermediate_size, h));
  output_norm_ = output->register_module("LayerNorm", MakeNorm(c));
  dropout_ = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
}

torch::Tensor BertLayerImpl::SelfAttention(const torch::Tensor& x, const torch::Tensor& keep_mask) {
  const int64_t batch = x.size(0), seq = x.size(1);
  auto split_heads = [&](const torch::Tensor& t) { return t.view({batch, seq, heads_, head_dim_}).transpose(1, 2); };
  std::optional<torch::Tensor> mask;
  if (keep_mask.defined()) mask = keep_mask;
  torch::Tensor context =
      at::scaled_dot_product_attention(split_heads(query_(x)), split_heads(key_(x)), split_heads(value_(x)), mask,
                                       is_training() ? attention_dropout_ : 0.0);
  return context.transpose(1, 2).reshape({batch, seq, heads_ * head_dim_});
}

torch::Tensor BertLayerImpl::forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask) {
  torch::Tensor attended = attention_norm_(dropout_(attention_out_(SelfAttention(hidden, keep_mask))) + hidden);
  torch::Tensor expanded = torch::gelu(intermediate_(attended));
  return output_norm_(dropout_(output_(expanded)) + attended);
}

BertForSequenceClassificationImpl::BertForSequenceClassificationImpl(BertConfig config) : config_(std::move(config)) {
  const BertConfig& c = config_;
  auto bert = Node(*this, "bert");
  auto embeddings = Node(*bert, "embeddings");
  word_embeddings_ = embeddings->register_module(
      "word_embeddings",
      torch::nn::Embedding(torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size).padding_idx(c.pad_token_id)));
  position_embeddings_ = embeddings->register_module("position_embeddings",
                                                     torch::nn::Embedding(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings_ =
      embeddings->register_module("token_type_embeddings", torch::nn::Embedding(c.type_vocab_size, c.hidden_size));
  embedding_norm_ = embeddings->register_module("LayerNorm", MakeNorm(c));
  auto layer_list = Node(*Node(*bert, "encoder"), "layer");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers_.push_back(layer_list->register_module(std::to_string(i), BertLayer(c)));
  pooler_ = Node(*bert, "pooler")->register_module("dense", torch::nn::Linear(c.hidden_size, c.hidden_size));
  classifier_ = register_module("classifier", torch::nn::Linear(c.hidden_size, c.num_labels()));
  dropout_ = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
  InitWeights();
}

void BertForSequenceClassificationImpl::InitWeights() {
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    if (name.find("LayerNorm.weight") != std::string::npos) {
      p.fill_(1.0);
    } else if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else {
      p.normal_(0.0, 0.02);
    }
  }
  word_embeddings_->weight[config_.pad_token_id].zero_();
}

torch::Tensor BertForSequenceClassificationImpl::Embed(const torch::Tensor& input_ids) {
  const int64_t seq = input_ids.size(1);
  if (seq > config_.max_position_embeddings)
    throw std::invalid_argument("sequence length " + std::to_string(seq) + " exceeds max_position_embeddings " +
                                std::to_string(config_.max_position_embeddings));
  auto options = torch::TensorOptions().dtype(torch::kLong).device(input_ids.device());
  torch::Tensor positions = torch::arange(seq, options).unsqueeze(0);
  torch::Tensor token_types = torch::zeros_like(input_ids);
  torch::Tensor sum =
      word_embeddings_(input_ids) + token_type_embeddings_(token_types) + position_embeddings_(positions);
  return dropout_(embedding_norm_(sum));
}

torch::Tensor BertForSequenceClassificationImpl::forward(const torch::Tensor& input_ids,
                                                         const torch::Tensor& attention_mask) {
  // A batch without padding needs no mask, and without one SDPA can take its fused
  // kernels (on CPU a masked call falls back to the reference path). Checked for CPU
  // tensors only: on a GPU the check would stall the stream and break graph capture.
  torch::Tensor keep_mask;
  if (attention_mask.is_cuda() || !attention_mask.all().item<bool>())
    keep_mask = attention_mask.to(torch::kBool).unsqueeze(1).unsqueeze(2);
  torch::Tensor hidden = Embed(input_ids);
  for (auto& layer : layers_) hidden = layer->forward(hidden, keep_mask);
  torch::Tensor pooled = torch::tanh(pooler_(hidden.select(1, 0)));
  return classifier_(dropout_(pooled));
}

}  // namespace trainyard
