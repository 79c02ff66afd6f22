// RoBERTa for sequence classification, under HF's RobertaForSequenceClassification
// names: BERT's encoder (bert.h) without a pooler, position ids counted over the
// non-padding tokens from pad_token_id + 1, one token-type row in released checkpoints,
// and the head classifier.dense -> tanh -> classifier.out_proj on the first token.
#pragma once

#include <torch/torch.h>

#include "worker/models/bert.h"
#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace trainyard {

// RoBERTa's config.json defaults where they differ from BERT's (HF's RobertaConfig).
BertConfig RobertaDefaults();

class RobertaForSequenceClassificationImpl : public EncoderClassifierImpl {
 public:
  explicit RobertaForSequenceClassificationImpl(BertConfig config);
  void InitWeights() override;
  const ModelInfo& info() const override { return info_; }
  nlohmann::json HfConfig() const override;
  HfNaming naming() const override { return {"roberta.", {"classifier."}}; }

 private:
  torch::Tensor Classify(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                         const TokenPacking* packing) override;

  BertConfig config_;
  ModelInfo info_;
  BertEncoder roberta_{nullptr};
  AdaptableLinear dense_{nullptr}, out_proj_{nullptr};
  Dropout dropout_{nullptr};
};
TORCH_MODULE(RobertaForSequenceClassification);

Model CreateRoberta(const nlohmann::json& config, ModelTask task);

}  // namespace trainyard
