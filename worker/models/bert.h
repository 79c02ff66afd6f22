// BERT: an encoder with a sequence-classification head. Module and parameter names are
// exactly Hugging Face's BertForSequenceClassification ("bert.encoder.layer.0.
// attention.self.query.weight", ...), so HF checkpoints load by name. RoBERTa
// (roberta.h) reuses the encoder with its own position ids and head.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/models/layers.h"
#include "worker/models/model.h"

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
  int64_t bos_token_id = -1, eos_token_id = -1;  // RoBERTa's <s> and </s>; BERT has none
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double classifier_dropout = -1;  // the classification head's; HF's null (< 0 here): hidden_dropout_prob
  double layer_norm_eps = 1e-12;
  std::vector<std::string> labels;  // id2label; its size is num_labels

  // HF config.json, read over `defaults` (RoBERTa's differ). Every size must be a JSON
  // integer in its range (config_fields.h), hidden_size divisible by
  // num_attention_heads and pad_token_id below vocab_size, so no model built from it
  // divides by zero or allocates absurdly. Throws std::runtime_error
  // "field '<key>': <problem>".
  static BertConfig FromJson(const nlohmann::json& json, BertConfig defaults);
  static BertConfig FromJson(const nlohmann::json& json) { return FromJson(json, BertConfig()); }
  // The fields both families write; the caller adds model_type and architectures.
  nlohmann::json ToJson() const;
  int64_t num_labels() const { return static_cast<int64_t>(labels.size()); }
  double ClassifierDropout() const { return classifier_dropout >= 0 ? classifier_dropout : hidden_dropout_prob; }
};

// tiny: 2 layers x 128, mini: 4 x 256, base: bert-base (12 x 768), as config.json.
nlohmann::json BertPresetSizes(const std::string& preset);

class BertLayerImpl : public torch::nn::Module, public FusableAddNorm {
 public:
  explicit BertLayerImpl(const BertConfig& config);
  // Its two blocks' dropout + residual + LayerNorm fused on a GPU (DenseDropoutAddNorm()),
  // and its intermediate product's bias with GELU (DenseGelu()).
  void set_fused_add_norm(bool on) override { fused_add_norm_ = on; }
  // hidden: [B, S, H], or [N, H] packed by `tokens` (then so is the result); keep_mask:
  // [B, 1, 1, S] bool, true where a key may be attended, or undefined when every key may
  // be. Under Rows::kFirst the result is position 0's alone, [B, 1, H] (layers.h).
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask, const TokenIndex* tokens,
                        Rows rows = Rows::kAll);

 private:
  int64_t heads_;
  double attention_dropout_;
  AdaptableLinear query_{nullptr}, key_{nullptr}, value_{nullptr}, attention_out_{nullptr};
  FusedQkvWeights qkv_fused_;  // ProjectQkv's fused weight, reordered or cast
  AdaptableLinear intermediate_{nullptr}, output_{nullptr};
  torch::nn::LayerNorm attention_norm_{nullptr}, output_norm_{nullptr};
  Dropout dropout_{nullptr};
  bool fused_add_norm_ = false;
};
TORCH_MODULE(BertLayer);

// How position ids are made. BERT: 0..S-1. RoBERTa: counted over the tokens that are
// not padding, starting at pad_token_id + 1, with padding at pad_token_id.
enum class PositionIds { kFromZero, kAfterPadding };

// Embeddings and the encoder stack, with an optional pooler: HF's BertModel (and,
// with kAfterPadding and no pooler, RobertaModel).
class BertEncoderImpl : public torch::nn::Module {
 public:
  BertEncoderImpl(const BertConfig& config, PositionIds positions, bool with_pooler);
  // input_ids, attention_mask [B, S] int64. Returns the last hidden states [B, S, H]
  // (zeros at padding when `unpadding` chose to skip it), or, under Rows::kFirst,
  // position 0's alone, [B, 1, H], the last layer computing no other (layers.h). With
  // `packing` (the host's), it runs over those tokens (TokensToRun).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask, Unpadding unpadding,
                        Rows rows = Rows::kAll, const TokenPacking* packing = nullptr);
  // tanh(dense(hidden[:, 0])). REQUIRES: built with_pooler.
  torch::Tensor Pool(const torch::Tensor& hidden);
  // The longest input the position table allows.
  int64_t max_sequence() const;

 private:
  torch::Tensor PositionIdsOf(const torch::Tensor& input_ids) const;
  // The embeddings' sum for input_ids [B, S], or for the packed tokens when given: [N, H].
  torch::Tensor Embed(const torch::Tensor& input_ids, const TokenIndex* tokens);

  BertConfig config_;
  PositionIds positions_;
  torch::nn::Embedding word_embeddings_{nullptr}, position_embeddings_{nullptr}, token_type_embeddings_{nullptr};
  torch::nn::LayerNorm embedding_norm_{nullptr};
  std::vector<BertLayer> layers_;
  AdaptableLinear pooler_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(BertEncoder);

class BertForSequenceClassificationImpl : public EncoderClassifierImpl {
 public:
  explicit BertForSequenceClassificationImpl(BertConfig config);
  // HF's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms, zero pad row.
  void InitWeights() override;
  const ModelInfo& info() const override { return info_; }
  nlohmann::json HfConfig() const override;
  HfNaming naming() const override { return {"bert.", {"classifier."}}; }
  const BertConfig& config() const { return config_; }

 private:
  torch::Tensor Classify(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                         const TokenPacking* packing) override;

  BertConfig config_;
  ModelInfo info_;
  BertEncoder bert_{nullptr};
  AdaptableLinear classifier_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(BertForSequenceClassification);

Model CreateBert(const nlohmann::json& config, ModelTask task);

}  // namespace trainyard
