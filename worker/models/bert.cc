#include "worker/models/bert.h"

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

BertConfig BertConfig::FromJson(const nlohmann::json& j) {
  BertConfig c;
  auto field = [&](const char* key, auto* out) {
    if (!j.contains(key)) return;
    try {
      j.at(key).get_to(*out);
    } catch (const nlohmann::json::exception&) {
      throw std::runtime_error(std::string("config.json: field '") + key + "' has the wrong type");
    }
  };
  for (const char* required : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"})
    if (!j.contains(required)) throw std::runtime_error(std::string("config.json: missing field '") + required + "'");
  field("vocab_size", &c.vocab_size);
  field("hidden_size", &c.hidden_size);
  field("num_hidden_layers", &c.num_hidden_layers);
  field("num_attention_heads", &c.num_attention_heads);
  field("intermediate_size", &c.intermediate_size);
  field("max_position_embeddings", &c.max_position_embeddings);
  field("type_vocab_size", &c.type_vocab_size);
  field("pad_token_id", &c.pad_token_id);
  field("hidden_dropout_prob", &c.hidden_dropout_prob);
  field("attention_probs_dropout_prob", &c.attention_probs_dropout_prob);
  field("layer_norm_eps", &c.layer_norm_eps);
  if (j.contains("hidden_act") && j["hidden_act"] != "gelu")
    throw std::runtime_error("config.json: hidden_act must be 'gelu'");
  if (j.contains("id2label") && j["id2label"].is_object()) {
    c.labels.resize(j["id2label"].size());
    for (const auto& [id, name] : j["id2label"].items()) {
      size_t index = std::stoul(id);
      if (index >= c.labels.size()) throw std::runtime_error("config.json: id2label ids are not 0..n-1");
      c.labels[index] = name.get<std::string>();
    }
  } else {
    int64_t n = j.value("num_labels", 2);
    for (int64_t i = 0; i < n; ++i) c.labels.push_back("LABEL_" + std::to_string(i));
  }
  if (c.hidden_size % c.num_attention_heads != 0)
    throw std::runtime_error("config.json: hidden_size is not a multiple of num_attention_heads");
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
