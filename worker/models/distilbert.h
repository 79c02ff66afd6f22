// DistilBERT for sequence classification, under HF's DistilBertForSequenceClassification
// names (distilbert.transformer.layer.N.attention.q_lin, sa_layer_norm, ffn.lin1, ...):
// WordPiece ids, no token types, post-LN blocks with every LayerNorm at eps 1e-12 (HF
// hard-codes it), and the head pre_classifier -> ReLU -> classifier on the first token.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace trainyard {

struct DistilBertConfig {
  int64_t vocab_size = 30522;
  int64_t dim = 768;
  int64_t n_layers = 6;
  int64_t n_heads = 12;
  int64_t hidden_dim = 3072;
  int64_t max_position_embeddings = 512;
  int64_t pad_token_id = 0;
  double dropout = 0.1, attention_dropout = 0.1, seq_classif_dropout = 0.2;
  std::vector<std::string> labels;

  // HF config.json (sinusoidal position tables are refused). Throws std::runtime_error
  // "field '<key>': <problem>".
  static DistilBertConfig FromJson(const nlohmann::json& json);
  nlohmann::json ToJson() const;
};

nlohmann::json DistilBertPresetSizes(const std::string& preset);

class DistilBertLayerImpl : public torch::nn::Module {
 public:
  explicit DistilBertLayerImpl(const DistilBertConfig& config);
  // hidden [B, S, dim] or packed [N, dim]; keep_mask and tokens as BertLayer's.
  // As BertLayer's: under Rows::kFirst the result is position 0's alone, [B, 1, H].
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask, const TokenIndex* tokens,
                        Rows rows = Rows::kAll);

 private:
  int64_t heads_;
  double attention_dropout_;
  AdaptableLinear q_lin_{nullptr}, k_lin_{nullptr}, v_lin_{nullptr}, out_lin_{nullptr};
  FusedQkvWeights qkv_fused_;  // ProjectQkv's fused weight, reordered or cast
  AdaptableLinear lin1_{nullptr}, lin2_{nullptr};
  torch::nn::LayerNorm sa_layer_norm_{nullptr}, output_layer_norm_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(DistilBertLayer);

class DistilBertForSequenceClassificationImpl : public EncoderClassifierImpl {
 public:
  explicit DistilBertForSequenceClassificationImpl(DistilBertConfig config);
  void InitWeights() override;
  const ModelInfo& info() const override { return info_; }
  nlohmann::json HfConfig() const override;
  HfNaming naming() const override { return {"distilbert.", {"pre_classifier.", "classifier."}}; }

 private:
  torch::Tensor Classify(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                         const TokenPacking* packing) override;

  DistilBertConfig config_;
  ModelInfo info_;
  torch::nn::Embedding word_embeddings_{nullptr}, position_embeddings_{nullptr};
  torch::nn::LayerNorm embedding_norm_{nullptr};
  std::vector<DistilBertLayer> layers_;
  AdaptableLinear pre_classifier_{nullptr}, classifier_{nullptr};
  Dropout dropout_{nullptr}, classifier_dropout_{nullptr};
};
TORCH_MODULE(DistilBertForSequenceClassification);

Model CreateDistilBert(const nlohmann::json& config, ModelTask task);

}  // namespace trainyard
