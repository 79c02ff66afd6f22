// The model interface the trainer, the benchmark and inference use, whatever the
// family, and the registry that builds a family's model from a Hugging Face
// config.json or a preset.
//
// Each family lives in its own file pair with the same shape (bert, roberta,
// distilbert, gpt2): a config read from and written to HF's config.json, the modules
// under HF's parameter names (so HF checkpoints load by name and HF loads what we
// save), and a Create function the registry calls.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/models/layers.h"

namespace trainyard {

enum class ModelFamily { kBert, kRoberta, kDistilBert, kGpt2 };
enum class ModelTask { kSequenceClassification, kCausalLm };

// "bert", "roberta", "distilbert", "gpt2": config.json's model_type.
const char* FamilyName(ModelFamily family);
const char* TaskName(ModelTask task);

// What jobs need to know of a model, whatever its family.
struct ModelInfo {
  ModelFamily family = ModelFamily::kBert;
  ModelTask task = ModelTask::kSequenceClassification;
  int64_t vocab_size = 0;
  int64_t max_sequence = 0;         // the longest input the position table allows
  int64_t pad_id = 0;               // the id padding uses (GPT-2 has none of its own: -1)
  std::vector<std::string> labels;  // a classifier's; empty for a causal LM
};

// How a family's parameter names relate to the checkpoints HF writes.
struct HfNaming {
  // The base model's prefix ("bert."); checkpoints of the bare base model lack it.
  std::string base_prefix;
  // Task-head prefixes ("classifier."): a head missing from the checkpoint, or of
  // another shape (another label count), keeps its fresh initialisation.
  std::vector<std::string> head_prefixes;
};

class ModelImpl : public torch::nn::Module {
 public:
  // input_ids, attention_mask: [B, S] int64, mask 1 = real token. A classifier returns
  // logits [B, labels]; a causal LM returns logits [B, S, vocab].
  virtual torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) = 0;
  // forward() over a batch whose real tokens the host has found (TokenPacking, made by
  // the data pipeline for a GPU): an encoder runs over them, whatever unpadding() says;
  // a family that does not unpad (GPT-2) runs forward().
  virtual torch::Tensor ForwardPacked(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                      const TokenPacking& packing) {
    (void)packing;
    return forward(input_ids, attention_mask);
  }
  // The family's HF initialisation.
  virtual void InitWeights() = 0;
  virtual const ModelInfo& info() const = 0;
  // The config.json that describes this model to transformers' from_pretrained.
  virtual nlohmann::json HfConfig() const = 0;
  virtual HfNaming naming() const = 0;
  // How an encoder treats padded batches (TokenIndex in layers.h). A causal LM, whose
  // batches are packed blocks or left-padded prompts, ignores it.
  void set_unpadding(Unpadding policy) { unpadding_ = policy; }
  // Whether the blocks that end in dropout + residual + LayerNorm run it fused on a GPU
  // (DropoutAddNorm() in layers.h). Returns how many modules have such blocks: 0 for a
  // family without them (DistilBERT, GPT-2).
  int64_t set_fused_add_norm(bool on);
  Unpadding unpadding() const { return unpadding_; }
  // Whether a classifier's last layer computes position 0 alone (Rows::kFirst in
  // layers.h): the default; int8 models turn it off, since their inputs' quantization
  // range is taken over every row, as torch's dynamic quantization takes it.
  void set_head_rows_only(bool on) { head_rows_only_ = on; }
  Rows head_rows() const { return head_rows_only_ ? Rows::kFirst : Rows::kAll; }

 private:
  Unpadding unpadding_ = Unpadding::kAuto;
  bool head_rows_only_ = true;
};
// A classifier over an encoder that unpads (BERT, RoBERTa, DistilBERT): forward() and
// ForwardPacked() are one Classify(), without the host's packing or with it.
class EncoderClassifierImpl : public ModelImpl {
 public:
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) final {
    return Classify(input_ids, attention_mask, nullptr);
  }
  torch::Tensor ForwardPacked(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const TokenPacking& packing) final {
    return Classify(input_ids, attention_mask, &packing);
  }

 protected:
  // Logits [B, labels]. packing: the host's, which the encoder then runs over
  // (TokensToRun), or null.
  virtual torch::Tensor Classify(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                 const TokenPacking* packing) = 0;
};

using Model = std::shared_ptr<ModelImpl>;

class KvCache;

// A causal LM that generates: forward() for training and scoring, Step() for decoding
// with a KV cache (generation.h explains the loop).
class CausalLmImpl : public ModelImpl {
 public:
  // ids, positions: [B, T] int64; key_keep: [B, cache.length() + T] bool, false at
  // padding. Appends the T positions' keys and values to `cache` (then advances it) and
  // returns logits [B, T, vocab], or [B, 1, vocab] for the last position when last_only.
  // With a cache at a write slot (KvCache::UseWriteSlot): T is 1 and key_keep is
  // [B, cache.capacity()], true exactly where a position may be attended (the slot
  // included); the step then has the same shapes every time (CUDA-graph capture).
  virtual torch::Tensor Step(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& key_keep,
                             KvCache& cache, bool last_only) = 0;
  // An empty cache for `batch` rows and `capacity` positions, on the model's device, in
  // `dtype` (the autocast dtype under mixed precision).
  virtual KvCache NewCache(int64_t batch, int64_t capacity, torch::ScalarType dtype) const = 0;
  // The token the model ends a text with (GPT-2's <|endoftext|>); -1 if none.
  virtual int64_t eos_id() const = 0;
};

// The family config.json names: model_type, else the first of architectures, else BERT
// (configs written before families existed). Throws std::runtime_error
// "field 'model_type': ..." for a family we do not have.
ModelFamily FamilyOf(const nlohmann::json& config);
// The task an HF config's architectures imply (…ForCausalLM / …LMHeadModel: causal LM),
// else sequence classification.
ModelTask TaskOf(const nlohmann::json& config);
// "bert" etc. to the family. Throws std::invalid_argument naming the known ones.
ModelFamily FamilyNamed(const std::string& name);

// What a preset needs beyond its sizes: the tokenizer's facts and the job's labels.
struct PresetArgs {
  int64_t vocab_size = 0;
  int64_t max_sequence = 128;  // the longest input the job will feed
  int64_t pad_id = 0, bos_id = -1, eos_id = -1;
  std::vector<std::string> labels;
};
// The config.json of a preset: tiny (2 layers x 128), mini (4 x 256), base (the
// family's released base size). Throws std::invalid_argument for an unknown preset.
nlohmann::json PresetConfig(ModelFamily family, ModelTask task, const std::string& preset, const PresetArgs& args);

// config.json edits a job makes before building: every dropout of the family set to p;
// the classifier's labels replaced.
void SetDropout(nlohmann::json* config, double p);
void SetLabels(nlohmann::json* config, const std::vector<std::string>& labels);

// Throws as CreateModel would for a config.json that cannot be built, without building.
void CheckConfig(const nlohmann::json& config);

// Marks every parameter as not wanting a gradient: for a model that only infers
// (inference, serving, generation, the benchmark's cells), so that its products take
// the frozen-weight paths: packed_linear.h's on the CPU in fp32, and under bf16 or fp16
// autocast compute_dtype_weights.h's, which casts each weight once.
void Freeze(torch::nn::Module& model);

// The model a config.json describes, for `task`, freshly initialised. Throws
// std::runtime_error "field '<key>': <problem>" for a config that cannot be built, and
// for a family without a model for the task.
Model CreateModel(const nlohmann::json& config, ModelTask task);

}  // namespace trainyard
