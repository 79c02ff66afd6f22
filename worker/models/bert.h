// A BERT encoder with a sequence-classification head. Module and parameter names are
// exactly Hugging Face's BertForSequenceClassification ("bert.encoder.layer.0.
// attention.self.query.weight", ...), so HF checkpoints load by name.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainyard {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  int64_t pad_token_id = 0;
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double layer_norm_eps = 1e-12;
  std::vector<std::string> labels;  // id2label; its size is num_labels

  // tiny: 2 layers x 128, mini: 4 x 256, base: bert-base (12 x 768).
  // Throws std::invalid_argument for an unknown preset.
  static BertConfig Preset(const std::string& name, int64_t vocab_size, std::vector<std::string> labels,
                           int64_t max_positions);
  // HF config.json. Every size must be a JSON integer in its range (README), hidden_size
  // divisible by num_attention_heads and pad_token_id below vocab_size, so no model
  // built from it divides by zero or allocates absurdly. Throws std::runtime_error
  // "field '<key>': <problem>".
  static BertConfig FromJson(const nlohmann::json& json);
  nlohmann::json ToJson() const;
  int64_t num_labels() const { return static_cast<int64_t>(labels.size()); }
};

class BertLayerImpl : public torch::nn::Module {
 public:
  explicit BertLayerImpl(const BertConfig& config);
  // hidden: [B, S, H]; keep_mask: [B, 1, 1, S] bool, true where a key may be attended,
  // or undefined when every key may be.
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask);

 private:
  torch::Tensor SelfAttention(const torch::Tensor& hidden, const torch::Tensor& keep_mask);

  int64_t heads_, head_dim_;
  double attention_dropout_;
  torch::nn::Linear query_{nullptr}, key_{nullptr}, value_{nullptr}, attention_out_{nullptr};
  torch::nn::Linear intermediate_{nullptr}, output_{nullptr};
  torch::nn::LayerNorm attention_norm_{nullptr}, output_norm_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(BertLayer);

class BertForSequenceClassificationImpl : public torch::nn::Module {
 public:
  explicit BertForSequenceClassificationImpl(BertConfig config);
  // input_ids, attention_mask: [B, S] int64 (mask 1 = real token). Returns logits [B, labels].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask);
  // HF's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms, zero pad row.
  void InitWeights();
  const BertConfig& config() const { return config_; }

 private:
  torch::Tensor Embed(const torch::Tensor& input_ids);

  BertConfig config_;
  torch::nn::Embedding word_embeddings_{nullptr}, position_embeddings_{nullptr}, token_type_embeddings_{nullptr};
  torch::nn::LayerNorm embedding_norm_{nullptr};
  std::vector<BertLayer> layers_;
  torch::nn::Linear pooler_{nullptr}, classifier_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(BertForSequenceClassification);

}  // namespace trainyard
