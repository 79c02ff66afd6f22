// LoRA adapters compatible with PEFT (peft 0.21's LoraConfig and file layout).
//
// ApplyLora attaches an adapter (layers.h LoraSlot) to every Linear/Conv1D layer that
// target_modules names, freezes every other parameter except those of modules_to_save,
// and so leaves requires_grad set on exactly what is trained: the optimizer, the
// gradient all-reduce and training checkpoints take only those. Matching follows PEFT:
//   - a target matches a module whose dotted name equals it or ends with "." + it; or,
//     where target_modules is one string (target_regex), a module whose whole dotted
//     name matches it as a regex (PEFT's re.fullmatch, on RE2: common/module_pattern.h);
//   - a module inside a modules_to_save module (a path component equal to the name) is
//     never a target;
//   - modules_to_save matches a module whose name ends with the string (plain suffix);
//     a classifier also saves "classifier" and "score", as PEFT's SEQ_CLS task does.
// An adapter folder holds adapter_model.safetensors (every trained tensor, named
// "base_model.model." + our parameter name, which is HF's) and adapter_config.json;
// PeftModel.from_pretrained loads what SaveAdapter writes and LoadAdapter reads what
// PEFT saves. A merged model is a plain HF folder with W' = W + scaling * B·A (transposed
// for Conv1D, whose weight is [in, out]), scaling = alpha / r, or alpha / sqrt(r) under
// rsLoRA.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/models/model.h"

namespace trainyard {

struct LoraOptions {
  int64_t r = 8;
  double alpha = 8.0;
  double dropout = 0.0;
  std::vector<std::string> target_modules;   // empty (and no target_regex): the family's PEFT default
  std::string target_regex;                  // instead of target_modules: PEFT's string form
  std::vector<std::string> modules_to_save;  // besides a classifier's head
  bool use_rslora = false;
};

struct LoraSummary {
  LoraOptions options;                     // as applied: default targets and the head filled in
  std::vector<std::string> adapted;        // the layers that got an adapter
  std::vector<std::string> saved_modules;  // trained in full (modules_to_save)
  int64_t trainable = 0, total = 0;        // parameter counts, as PEFT prints them (total: base only)
};

// PEFT's default targets for the family (bert, roberta: query, value; gpt2: c_attn).
// DistilBERT has none in PEFT: throws std::invalid_argument asking for target_modules.
std::vector<std::string> DefaultLoraTargets(ModelFamily family);

// Attaches the adapters and freezes the rest (see the file comment). Throws
// std::invalid_argument naming the targets when none matches a Linear/Conv1D layer.
LoraSummary ApplyLora(ModelImpl& model, LoraOptions options);

// adapter_config.json's fields as LoraOptions. Throws std::runtime_error naming the
// file and field for what we do not support (bias other than "none", DoRA, per-layer
// ranks).
LoraOptions ReadAdapterConfig(const std::string& folder);
// Copies an adapter folder's tensors into the adapted model. Every trainable tensor
// must be there with its shape; throws std::runtime_error naming the first that is not.
void LoadAdapter(const std::string& folder, ModelImpl& model);
// Writes adapter_model.safetensors and adapter_config.json. `options` as applied
// (LoraSummary::options); `base` names the base model (base_model_name_or_path).
void SaveAdapter(const std::string& folder, ModelImpl& model, const LoraOptions& options, const std::string& base);
// Writes a plain HF folder of the model with the adapters merged into the weights.
void SaveMergedModel(const std::string& folder, ModelImpl& model);

}  // namespace trainyard
