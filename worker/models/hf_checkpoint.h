// Torch tensors to and from safetensors, and Hugging Face model folders
// (model.safetensors + config.json).
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "worker/models/bert.h"

namespace trainyard {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Reads every tensor of a safetensors file onto the CPU. Throws SafetensorsError.
std::map<std::string, torch::Tensor> LoadSafetensors(const std::string& path,
                                                     std::map<std::string, std::string>* metadata);
// Writes tensors (any device; copied to CPU contiguous) atomically.
void SaveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata);

// Reads <folder>/config.json. Throws std::runtime_error naming the file.
BertConfig ReadHfConfig(const std::string& folder);
// Copies HF weights into `model` by name. Checkpoints of a bare BertModel (names
// without "bert.") load too. The classifier keeps its fresh initialisation when the
// checkpoint has none or one of another label count; the names so kept are returned.
// Any other missing or mis-shaped parameter throws std::runtime_error naming it.
std::vector<std::string> LoadHfWeights(const std::string& folder, BertForSequenceClassification& model);
// Writes <folder>/model.safetensors and <folder>/config.json, loadable by
// transformers' BertForSequenceClassification.from_pretrained(folder).
void SaveHfModel(const std::string& folder, BertForSequenceClassification& model);

}  // namespace trainyard
