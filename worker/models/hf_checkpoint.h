// Torch tensors to and from safetensors, and Hugging Face model folders
// (model.safetensors + config.json).
#pragma once

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "worker/models/model.h"

namespace trainyard {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Reads every tensor of a safetensors file onto the CPU. Throws SafetensorsError.
std::map<std::string, torch::Tensor> LoadSafetensors(const std::string& path,
                                                     std::map<std::string, std::string>* metadata);
// Writes tensors (any device; copied to CPU contiguous) atomically.
void SaveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata);

// Reads <folder>/config.json as JSON. Throws std::runtime_error naming the file.
nlohmann::json ReadHfConfig(const std::string& folder);
// Copies HF weights into `model` by name. Checkpoints of the bare base model (names
// without the family's prefix, "bert." etc.) load too, and tensors the model has no
// parameter for (GPT-2's attn.bias masks, a tied lm_head, a pooler or an MLM head) are
// ignored. A task head (naming().head_prefixes) keeps its fresh initialisation when the
// checkpoint has none or one of another shape; the names so kept are returned. Any
// other missing or mis-shaped parameter throws std::runtime_error naming it.
std::vector<std::string> LoadHfWeights(const std::string& folder, ModelImpl& model);
// Writes <folder>/model.safetensors and <folder>/config.json, loadable by transformers'
// from_pretrained for the model's HF class.
void SaveHfModel(const std::string& folder, ModelImpl& model);

}  // namespace trainyard
