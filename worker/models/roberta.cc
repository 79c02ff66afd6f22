#include "worker/models/roberta.h"

#include "worker/models/config_fields.h"
#include "worker/models/layers.h"

namespace trainyard {

BertConfig RobertaDefaults() {
  BertConfig c;
  c.vocab_size = 50265;
  c.max_position_embeddings = 514;
  c.type_vocab_size = 1;
  c.pad_token_id = 1;
  c.bos_token_id = 0;
  c.eos_token_id = 2;
  c.layer_norm_eps = 1e-5;
  return c;
}

RobertaForSequenceClassificationImpl::RobertaForSequenceClassificationImpl(BertConfig config)
    : config_(std::move(config)) {
  const BertConfig& c = config_;
  if (c.max_position_embeddings <= c.pad_token_id + 1)
    ConfigFail("max_position_embeddings", "must exceed pad_token_id + 1 = " + std::to_string(c.pad_token_id + 1) +
                                              " (RoBERTa's positions start after the padding index)");
  roberta_ = register_module("roberta", BertEncoder(c, PositionIds::kAfterPadding, /*with_pooler=*/false));
  auto classifier = Node(*this, "classifier");
  dense_ = classifier->register_module("dense", AdaptableLinear(c.hidden_size, c.hidden_size));
  out_proj_ = classifier->register_module("out_proj", AdaptableLinear(c.hidden_size, c.num_labels()));
  dropout_ = register_module("dropout", Dropout(c.ClassifierDropout()));
  info_ = {ModelFamily::kRoberta, ModelTask::kSequenceClassification,
           c.vocab_size,          roberta_->max_sequence(),
           c.pad_token_id,        c.labels};
  InitWeights();
}

void RobertaForSequenceClassificationImpl::InitWeights() { InitHfStyle(*this, 0.02); }

nlohmann::json RobertaForSequenceClassificationImpl::HfConfig() const {
  nlohmann::json j = config_.ToJson();
  j["architectures"] = {"RobertaForSequenceClassification"};
  j["model_type"] = "roberta";
  return j;
}

torch::Tensor RobertaForSequenceClassificationImpl::Classify(const torch::Tensor& input_ids,
                                                             const torch::Tensor& attention_mask,
                                                             const TokenPacking* packing) {
  torch::Tensor first = roberta_->forward(input_ids, attention_mask, unpadding(), head_rows(), packing).select(1, 0);
  return out_proj_(dropout_(torch::tanh(dense_(dropout_(first)))));
}

Model CreateRoberta(const nlohmann::json& config, ModelTask task) {
  if (task != ModelTask::kSequenceClassification)
    ConfigFail("model_type", std::string("roberta has no ") + TaskName(task) + " model here");
  return std::make_shared<RobertaForSequenceClassificationImpl>(BertConfig::FromJson(config, RobertaDefaults()));
}

}  // namespace trainyard
