#include "worker/models/lora.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>

#include "common/atomic_file.h"
#include "common/module_pattern.h"
#include "worker/models/hf_checkpoint.h"
#include "worker/models/layers.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
const char kPeftPrefix[] = "base_model.model.";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsTarget(const std::string& name, const std::vector<std::string>& targets, const ModulePattern* pattern) {
  if (pattern) return pattern->FullMatch(name);
  for (const auto& t : targets)
    if (name == t || EndsWith(name, "." + t)) return true;
  return false;
}

// PEFT's check: some dotted component of `name` equals a modules_to_save entry.
bool InsideSaved(const std::string& name, const std::vector<std::string>& saved) {
  const std::string dotted = "." + name + ".";
  for (const auto& m : saved)
    if (dotted.find("." + m + ".") != std::string::npos) return true;
  return false;
}

// Attaches an adapter if `module` is a Linear or Conv1D; returns whether it did.
bool AttachTo(torch::nn::Module& module, const LoraOptions& o, double scaling) {
  if (auto* linear = dynamic_cast<AdaptableLinearImpl*>(&module)) {
    linear->lora.Attach(module, linear->weight.size(1), linear->weight.size(0), o.r, scaling, o.dropout);
    return true;
  }
  if (auto* conv = dynamic_cast<Conv1DImpl*>(&module)) {
    conv->lora.Attach(module, conv->weight.size(0), conv->weight.size(1), o.r, scaling, o.dropout);
    return true;
  }
  return false;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string TargetsText(const LoraOptions& o) {
  return o.target_regex.empty() ? "[" + Join(o.target_modules) + "]" : "'" + o.target_regex + "'";
}

// PEFT's string form of target_modules. Throws std::runtime_error naming the problem.
std::unique_ptr<ModulePattern> CompileTargetRegex(const std::string& text) {
  std::string error;
  std::unique_ptr<ModulePattern> pattern = ModulePattern::Compile(text, &error);
  if (!pattern) throw std::runtime_error("field 'target_modules': '" + text + "' is not a usable regex: " + error);
  return pattern;
}

// The last component of every adaptable layer's name (for the error message).
std::vector<std::string> AdaptableNames(ModelImpl& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const bool adaptable = item.value()->as<AdaptableLinear>() || item.value()->as<Conv1D>();
    const std::string last = item.key().substr(item.key().rfind('.') + 1);
    if (adaptable && std::find(names.begin(), names.end(), last) == names.end()) names.push_back(last);
  }
  return names;
}

void FreezeAllBut(ModelImpl& model, const std::vector<std::string>& saved_modules) {
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    bool trained = EndsWith(name, ".lora_A") || EndsWith(name, ".lora_B") || name == "lora_A" || name == "lora_B";
    for (const auto& m : saved_modules) trained = trained || EndsWith(name, m);
    if (trained)
      for (auto& p : item.value()->parameters()) p.set_requires_grad(true);
  }
}

const nlohmann::json& Field(const nlohmann::json& j, const std::string& key, const std::string& path) {
  if (!j.contains(key)) throw std::runtime_error(path + ": field '" + key + "': missing");
  return j.at(key);
}

}  // namespace

std::vector<std::string> DefaultLoraTargets(ModelFamily family) {
  switch (family) {
    case ModelFamily::kBert:
    case ModelFamily::kRoberta:
      return {"query", "value"};
    case ModelFamily::kGpt2:
      return {"c_attn"};
    case ModelFamily::kDistilBert:
      break;
  }
  throw std::invalid_argument(std::string(FamilyName(family)) +
                              " has no default LoRA targets (nor in PEFT): name them, e.g. [q_lin, v_lin]");
}

LoraSummary ApplyLora(ModelImpl& model, LoraOptions o) {
  const ModelInfo& info = model.info();
  if (o.target_modules.empty() && o.target_regex.empty()) o.target_modules = DefaultLoraTargets(info.family);
  std::unique_ptr<ModulePattern> pattern;
  if (!o.target_regex.empty()) pattern = CompileTargetRegex(o.target_regex);
  if (info.task == ModelTask::kSequenceClassification)
    for (const char* head : {"classifier", "score"})
      if (std::find(o.modules_to_save.begin(), o.modules_to_save.end(), head) == o.modules_to_save.end())
        o.modules_to_save.push_back(head);
  const double scaling = o.use_rslora ? o.alpha / std::sqrt(double(o.r)) : o.alpha / double(o.r);
  LoraSummary summary;
  summary.options = o;
  for (const auto& p : model.parameters()) summary.total += p.numel();
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (!IsTarget(name, o.target_modules, pattern.get()) || InsideSaved(name, o.modules_to_save)) continue;
    if (AttachTo(*item.value(), o, scaling)) summary.adapted.push_back(name);
  }
  if (summary.adapted.empty())
    throw std::invalid_argument("target_modules " + TargetsText(o) + " match no Linear/Conv1D layer of this " +
                                FamilyName(info.family) + " model (its layers: " + Join(AdaptableNames(model)) + ")");
  FreezeAllBut(model, o.modules_to_save);
  for (const auto& item : model.named_modules("", false))
    for (const auto& m : o.modules_to_save)
      if (EndsWith(item.key(), m)) summary.saved_modules.push_back(item.key());
  for (const auto& p : model.parameters())
    if (p.requires_grad()) summary.trainable += p.numel();
  return summary;
}

LoraOptions ReadAdapterConfig(const std::string& folder) {
  const std::string path = (fs::path(folder) / "adapter_config.json").string();
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    LoraOptions o;
    if (Field(j, "peft_type", path) != "LORA") throw std::runtime_error("field 'peft_type': expected \"LORA\"");
    o.r = Field(j, "r", path).get<int64_t>();
    o.alpha = Field(j, "lora_alpha", path).get<double>();
    o.dropout = j.value("lora_dropout", 0.0);
    o.use_rslora = j.value("use_rslora", false);
    const nlohmann::json& targets = Field(j, "target_modules", path);
    if (targets.is_string()) {
      o.target_regex = targets.get<std::string>();
      CompileTargetRegex(o.target_regex);
    } else if (targets.is_array()) {
      o.target_modules = targets.get<std::vector<std::string>>();
    } else {
      throw std::runtime_error("field 'target_modules': expected a list of names or a regex string");
    }
    if (j.contains("modules_to_save") && !j["modules_to_save"].is_null())
      o.modules_to_save = j["modules_to_save"].get<std::vector<std::string>>();
    if (j.value("bias", std::string("none")) != "none") throw std::runtime_error("field 'bias': only \"none\"");
    if (j.value("use_dora", false)) throw std::runtime_error("field 'use_dora': DoRA is not supported");
    for (const char* key : {"rank_pattern", "alpha_pattern"})
      if (j.contains(key) && !j[key].is_null() && !j[key].empty())
        throw std::runtime_error(std::string("field '") + key + "': per-layer ranks are not supported");
    if (o.r < 1 || o.r > 65536) throw std::runtime_error("field 'r': expected an integer in [1, 65536]");
    return o;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    throw std::runtime_error(what.rfind(path, 0) == 0 ? what : path + ": " + what);
  }
}

void LoadAdapter(const std::string& folder, ModelImpl& model) {
  const std::string path = (fs::path(folder) / "adapter_model.safetensors").string();
  auto tensors = LoadSafetensors(path, nullptr);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    auto it = tensors.find(kPeftPrefix + item.key());
    if (it == tensors.end()) throw std::runtime_error(path + ": missing tensor '" + kPeftPrefix + item.key() + "'");
    if (it->second.sizes() != item.value().sizes())
      throw std::runtime_error(path + ": tensor '" + it->first + "' has shape " + c10::str(it->second.sizes()) +
                               ", the model expects " + c10::str(item.value().sizes()));
    item.value().copy_(it->second);
  }
}

void SaveAdapter(const std::string& folder, ModelImpl& model, const LoraOptions& o, const std::string& base) {
  fs::create_directories(folder);
  NamedTensors tensors;
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) tensors.emplace_back(kPeftPrefix + item.key(), item.value());
  SaveSafetensors((fs::path(folder) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  const ModelInfo& info = model.info();
  const bool classifier = info.task == ModelTask::kSequenceClassification;
  nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", classifier ? "SEQ_CLS" : "CAUSAL_LM"},
      {"r", o.r},
      {"lora_alpha", o.alpha},
      {"lora_dropout", o.dropout},
      {"target_modules", o.target_regex.empty() ? nlohmann::json(o.target_modules) : nlohmann::json(o.target_regex)},
      {"modules_to_save", o.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.modules_to_save)},
      {"fan_in_fan_out", info.family == ModelFamily::kGpt2},  // Conv1D weights are [in, out]
      {"bias", "none"},
      {"use_rslora", o.use_rslora},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"base_model_name_or_path", base.empty() ? nlohmann::json(nullptr) : nlohmann::json(base)}};
  WriteFileAtomically((fs::path(folder) / "adapter_config.json").string(), config.dump(2) + "\n");
}

void SaveMergedModel(const std::string& folder, ModelImpl& model) {
  torch::NoGradGuard no_grad;
  NamedTensors tensors;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (EndsWith(name, "lora_A") || EndsWith(name, "lora_B")) continue;
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      torch::Tensor value = p.value().detach();
      if (p.key() == "weight") {
        if (auto* linear = item.value()->as<AdaptableLinear>(); linear && linear->lora.adapted())
          value = value + linear->lora.DeltaWeight();
        if (auto* conv = item.value()->as<Conv1D>(); conv && conv->lora.adapted())
          value = value + conv->lora.DeltaWeight().t();
      }
      tensors.emplace_back(name + "." + p.key(), value);
    }
  }
  fs::create_directories(folder);
  SaveSafetensors((fs::path(folder) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  WriteFileAtomically((fs::path(folder) / "config.json").string(), model.HfConfig().dump(2) + "\n");
}

}  // namespace trainyard
