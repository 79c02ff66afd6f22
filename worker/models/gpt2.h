// GPT-2, under HF's names: the causal LM (GPT2LMHeadModel, whose lm_head is tied to
// wte and so never saved) and GPT2ForSequenceClassification (a bias-free `score` on the
// last token that is not padding). Pre-LN blocks; attention and MLP projections are
// Conv1D, weights stored [in, out]. Checkpoints with or without the "transformer."
// prefix load, and the attn.bias / attn.masked_bias buffers old checkpoints carry are
// skipped (they are masks, not weights).
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/models/kv_cache.h"
#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace trainyard {

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;                           // 0: 4 * n_embd (HF's null)
  std::string activation_function = "gelu_new";  // gelu_new | gelu_pytorch_tanh | gelu
  double layer_norm_epsilon = 1e-5;
  double resid_pdrop = 0.1, embd_pdrop = 0.1, attn_pdrop = 0.1;
  bool scale_attn_weights = true, scale_attn_by_inverse_layer_idx = false;
  int64_t bos_token_id = 50256, eos_token_id = 50256;
  int64_t pad_token_id = -1;        // HF's null
  std::vector<std::string> labels;  // the classifier's; unused by the LM

  // HF config.json. Throws std::runtime_error "field '<key>': <problem>".
  static Gpt2Config FromJson(const nlohmann::json& json);
  // Without architectures; the task's class adds it.
  nlohmann::json ToJson() const;
  int64_t inner() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

nlohmann::json Gpt2PresetSizes(const std::string& preset);

class Gpt2BlockImpl : public torch::nn::Module {
 public:
  Gpt2BlockImpl(const Gpt2Config& config, int64_t layer_index);
  // hidden [B, S, E]; keep_mask [B, 1, 1, S] bool over keys or undefined; causal always.
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& keep_mask);
  // Decoding: hidden [B, T, E] of the new positions; mask [B, 1, T, cache.length() + T]
  // (CausalKeepMask), or undefined with `causal` (SDPA's own causal mask, REQUIRES an
  // empty cache) or without (every key kept). Appends this layer's keys and values to
  // `cache` as `layer`.
  torch::Tensor Step(const torch::Tensor& hidden, const torch::Tensor& mask, bool causal, KvCache& cache,
                     int64_t layer);

 private:
  torch::Tensor Mlp(const torch::Tensor& x);

  int64_t heads_;
  double attention_dropout_, scale_;
  bool exact_gelu_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Conv1D c_attn_{nullptr}, attn_proj_{nullptr}, c_fc_{nullptr}, mlp_proj_{nullptr};
  Dropout resid_dropout_{nullptr};
};
TORCH_MODULE(Gpt2Block);

// HF's GPT2Model: wte, wpe, h.N, ln_f. Position ids are 0..S-1 whatever the mask, as
// HF's forward makes them when none are given.
class Gpt2ModelImpl : public torch::nn::Module {
 public:
  explicit Gpt2ModelImpl(const Gpt2Config& config);
  // input_ids, attention_mask [B, S]. Returns the final hidden states [B, S, E].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask);
  // CausalLmImpl::Step's contract, returning hidden states [B, T, E].
  torch::Tensor Step(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& key_keep,
                     KvCache& cache);
  const torch::Tensor& token_embedding() const { return wte_->weight; }

 private:
  Gpt2Config config_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  Dropout drop_{nullptr};
  std::vector<Gpt2Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt2Model);

// GPT-2's init: N(0, 0.02), and the residual projections (c_proj) N(0, 0.02/sqrt(2 n_layer)).
void InitGpt2Weights(torch::nn::Module& model, int64_t n_layer);

class Gpt2LMHeadModelImpl : public CausalLmImpl {
 public:
  explicit Gpt2LMHeadModelImpl(Gpt2Config config);
  // Logits [B, S, vocab] through the tied head (hidden @ wte^T).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) override;
  torch::Tensor Step(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& key_keep,
                     KvCache& cache, bool last_only) override;
  KvCache NewCache(int64_t batch, int64_t capacity, torch::ScalarType dtype) const override;
  int64_t eos_id() const override { return config_.eos_token_id; }
  void InitWeights() override { InitGpt2Weights(*this, config_.n_layer); }
  const ModelInfo& info() const override { return info_; }
  nlohmann::json HfConfig() const override;
  HfNaming naming() const override { return {"transformer.", {}}; }

 private:
  // hidden @ wte^T (a matmul), through wte's copy in autocast's dtype when wte is frozen.
  torch::Tensor Head(const torch::Tensor& hidden);

  Gpt2Config config_;
  ModelInfo info_;
  Gpt2Model transformer_{nullptr};
  ComputeDtypeWeights head_cast_;  // wte in autocast's dtype, when frozen (compute_dtype_weights.h)
};
TORCH_MODULE(Gpt2LMHeadModel);

class Gpt2ForSequenceClassificationImpl : public ModelImpl {
 public:
  explicit Gpt2ForSequenceClassificationImpl(Gpt2Config config);
  // Logits [B, labels] of the rightmost token that is not pad_token_id (HF's rule: from
  // the ids, so left and right padding both work). Without a pad_token_id only batch 1
  // is accepted (std::invalid_argument otherwise), as in HF.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) override;
  void InitWeights() override { InitGpt2Weights(*this, config_.n_layer); }
  const ModelInfo& info() const override { return info_; }
  nlohmann::json HfConfig() const override;
  HfNaming naming() const override { return {"transformer.", {"score."}}; }

 private:
  Gpt2Config config_;
  ModelInfo info_;
  Gpt2Model transformer_{nullptr};
  AdaptableLinear score_{nullptr};
};
TORCH_MODULE(Gpt2ForSequenceClassification);

Model CreateGpt2(const nlohmann::json& config, ModelTask task);

}  // namespace trainyard
