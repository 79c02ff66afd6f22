#include "worker/models/model.h"

#include <stdexcept>

#include "worker/models/bert.h"
#include "worker/models/config_fields.h"
#include "worker/models/distilbert.h"
#include "worker/models/gpt2.h"
#include "worker/models/roberta.h"

namespace trainyard {
namespace {

// The registry: one row per family.
struct FamilyEntry {
  ModelFamily family;
  const char* model_type;
  const char* architecture_prefix;  // HF class names start with it: "RobertaFor..."
  std::vector<std::string> dropout_keys;
  nlohmann::json (*preset_sizes)(const std::string& preset);
  Model (*create)(const nlohmann::json& config, ModelTask task);
  void (*check)(const nlohmann::json& config);  // parses the config, builds nothing
};

const std::vector<FamilyEntry>& Families() {
  static const std::vector<FamilyEntry> families = {
      {ModelFamily::kBert,
       "bert",
       "Bert",
       {"hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"},
       BertPresetSizes,
       CreateBert,
       [](const nlohmann::json& j) { BertConfig::FromJson(j); }},
      {ModelFamily::kRoberta,
       "roberta",
       "Roberta",
       {"hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"},
       BertPresetSizes,
       CreateRoberta,
       [](const nlohmann::json& j) { BertConfig::FromJson(j, RobertaDefaults()); }},
      {ModelFamily::kDistilBert,
       "distilbert",
       "DistilBert",
       {"dropout", "attention_dropout", "seq_classif_dropout"},
       DistilBertPresetSizes,
       CreateDistilBert,
       [](const nlohmann::json& j) { DistilBertConfig::FromJson(j); }},
      {ModelFamily::kGpt2,
       "gpt2",
       "GPT2",
       {"resid_pdrop", "embd_pdrop", "attn_pdrop"},
       Gpt2PresetSizes,
       CreateGpt2,
       [](const nlohmann::json& j) { Gpt2Config::FromJson(j); }},
  };
  return families;
}

const FamilyEntry& EntryOf(ModelFamily family) {
  for (const auto& entry : Families())
    if (entry.family == family) return entry;
  throw std::logic_error("unregistered model family");
}

std::string KnownFamilies() {
  std::string list;
  for (const auto& entry : Families()) list += (list.empty() ? "'" : ", '") + std::string(entry.model_type) + "'";
  return list;
}

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The position-table size a family needs for inputs of max_sequence tokens.
nlohmann::json PositionFields(ModelFamily family, const PresetArgs& args) {
  const int64_t length = std::max<int64_t>(args.max_sequence, 8);
  switch (family) {
    case ModelFamily::kGpt2:
      return {{"n_positions", length}};
    case ModelFamily::kRoberta:
      return {{"max_position_embeddings", length + args.pad_id + 1}, {"type_vocab_size", 1}};
    default:
      return {{"max_position_embeddings", length}};
  }
}

nlohmann::json SpecialIds(ModelFamily family, const PresetArgs& args) {
  nlohmann::json j = nlohmann::json::object();
  if (args.pad_id >= 0) j["pad_token_id"] = args.pad_id;
  if (args.bos_id >= 0 && family != ModelFamily::kDistilBert && family != ModelFamily::kBert)
    j["bos_token_id"] = args.bos_id;
  if (args.eos_id >= 0 && family != ModelFamily::kDistilBert && family != ModelFamily::kBert)
    j["eos_token_id"] = args.eos_id;
  return j;
}

}  // namespace

int64_t ModelImpl::set_fused_add_norm(bool on) {
  int64_t found = 0;
  for (const auto& module : modules())
    if (auto* fusable = dynamic_cast<FusableAddNorm*>(module.get())) {
      fusable->set_fused_add_norm(on);
      ++found;
    }
  return found;
}

const char* FamilyName(ModelFamily family) { return EntryOf(family).model_type; }

const char* TaskName(ModelTask task) { return task == ModelTask::kCausalLm ? "causal_lm" : "classification"; }

ModelFamily FamilyNamed(const std::string& name) {
  for (const auto& entry : Families())
    if (name == entry.model_type) return entry.family;
  throw std::invalid_argument("unknown model family '" + name + "' (expected " + KnownFamilies() + ")");
}

ModelFamily FamilyOf(const nlohmann::json& config) {
  if (!config.is_object()) throw std::runtime_error("expected a JSON object");
  if (config.contains("model_type")) {
    const nlohmann::json& type = config["model_type"];
    for (const auto& entry : Families())
      if (type.is_string() && type.get<std::string>() == entry.model_type) return entry.family;
    ConfigFail("model_type",
               "unknown model family " + type.dump().substr(0, 40) + " (expected " + KnownFamilies() + ")");
  }
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string()) {
    const std::string name = config["architectures"][0].get<std::string>();
    // The families' class-name prefixes are distinct ("DistilBert..." does not start
    // with "Bert"), so the first match is the only one.
    for (const auto& entry : Families())
      if (StartsWith(name, entry.architecture_prefix)) return entry.family;
    ConfigFail("architectures", "unknown model class '" + name.substr(0, 60) + "' (families: " + KnownFamilies() + ")");
  }
  return ModelFamily::kBert;
}

ModelTask TaskOf(const nlohmann::json& config) {
  if (config.contains("architectures") && config["architectures"].is_array())
    for (const auto& name : config["architectures"])
      if (name.is_string()) {
        const std::string s = name.get<std::string>();
        if (s.find("LMHeadModel") != std::string::npos || s.find("ForCausalLM") != std::string::npos)
          return ModelTask::kCausalLm;
      }
  return ModelTask::kSequenceClassification;
}

nlohmann::json PresetConfig(ModelFamily family, ModelTask task, const std::string& preset, const PresetArgs& args) {
  const FamilyEntry& entry = EntryOf(family);
  nlohmann::json j = entry.preset_sizes(preset);
  j["model_type"] = entry.model_type;
  j["vocab_size"] = args.vocab_size;
  j.update(PositionFields(family, args));
  j.update(SpecialIds(family, args));
  if (task == ModelTask::kSequenceClassification) SetLabels(&j, args.labels);
  return j;
}

void SetDropout(nlohmann::json* config, double p) {
  for (const auto& key : EntryOf(FamilyOf(*config)).dropout_keys) (*config)[key] = p;
}

void SetLabels(nlohmann::json* config, const std::vector<std::string>& labels) {
  config->erase("num_labels");
  PutLabels(labels, config);
}

void CheckConfig(const nlohmann::json& config) { EntryOf(FamilyOf(config)).check(config); }

void Freeze(torch::nn::Module& model) {
  for (auto& parameter : model.parameters()) parameter.set_requires_grad(false);
}

Model CreateModel(const nlohmann::json& config, ModelTask task) {
  return EntryOf(FamilyOf(config)).create(config, task);
}

}  // namespace trainyard
