#include "worker/serve/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "common/safetensors.h"
#include "common/tokenizer_json.h"
#include "data/byte_level_bpe_tokenizer.h"
#include "data/wordpiece_tokenizer.h"

namespace trainyard {
namespace fs = std::filesystem;
namespace {

constexpr int64_t kMaxVersion = 1'000'000'000;

bool ParseVersion(const std::string& name, int64_t* version) {
  if (name.empty() || name.size() > 10 || name[0] == '0') return false;
  if (!std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  *version = std::stoll(name);
  return *version <= kMaxVersion;
}

nlohmann::json ReadJsonFile(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.filename().string() + ": missing");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path.filename().string() + ": not valid JSON: " + e.what());
  }
}

// tokenizer_config.json is optional; a key absent or of another type takes `fallback`.
bool TokenizerFlag(const fs::path& folder, const char* key, bool fallback) {
  const fs::path file = folder / "tokenizer_config.json";
  if (!fs::exists(file)) return fallback;
  const nlohmann::json config = ReadJsonFile(file);
  return config.contains(key) && config[key].is_boolean() ? config[key].get<bool>() : fallback;
}

// A folder whose only tokenizer is tokenizer.json (common/tokenizer_json.h): its model
// must be the family's.
std::shared_ptr<const Tokenizer> TokenizerOfJson(const fs::path& file, const std::string& family) {
  const HfTokenizerFiles files = ReadTokenizerJson(file.string());
  const bool wordpiece = family == "bert" || family == "distilbert";
  if (wordpiece != (files.model == HfTokenizerFiles::Model::kWordPiece))
    throw std::runtime_error("tokenizer.json: a " + family + " model needs " +
                             (wordpiece ? "a WordPiece" : "a byte-level BPE") + " tokenizer");
  if (wordpiece)
    return std::make_shared<WordPieceTokenizer>(file.string(), std::istringstream(files.vocab), files.lowercase);
  ByteLevelBpeTokenizer::Options options;
  options.add_prefix_space = files.add_prefix_space;
  options.sequence_template =
      family == "roberta" ? ByteLevelBpeTokenizer::Template::kRoberta : ByteLevelBpeTokenizer::Template::kGpt2;
  return std::make_shared<ByteLevelBpeTokenizer>(file.string(), std::istringstream(files.vocab),
                                                 file.string() + " (its merges)", std::istringstream(files.merges),
                                                 options);
}

// The classic files where present (as AutoTokenizer's slow classes read them), else
// tokenizer.json.
std::shared_ptr<const Tokenizer> LoadTokenizer(const fs::path& folder, const std::string& family) {
  const bool classic = fs::exists(folder / (family == "bert" || family == "distilbert" ? "vocab.txt" : "vocab.json"));
  if (!classic && fs::exists(folder / "tokenizer.json")) return TokenizerOfJson(folder / "tokenizer.json", family);
  if (family == "bert" || family == "distilbert") {
    if (!fs::exists(folder / "vocab.txt")) throw std::runtime_error("vocab.txt: missing (a WordPiece vocabulary)");
    return std::make_shared<WordPieceTokenizer>((folder / "vocab.txt").string(),
                                                TokenizerFlag(folder, "do_lower_case", true));
  }
  for (const char* file : {"vocab.json", "merges.txt"})
    if (!fs::exists(folder / file)) throw std::runtime_error(std::string(file) + ": missing (byte-level BPE)");
  ByteLevelBpeTokenizer::Options options;
  options.add_prefix_space = TokenizerFlag(folder, "add_prefix_space", false);
  options.sequence_template =
      family == "roberta" ? ByteLevelBpeTokenizer::Template::kRoberta : ByteLevelBpeTokenizer::Template::kGpt2;
  return std::make_shared<ByteLevelBpeTokenizer>((folder / "vocab.json").string(), (folder / "merges.txt").string(),
                                                 options);
}

int64_t IntField(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || !config[key].is_number_integer() || config[key].get<int64_t>() <= 0)
    throw std::runtime_error(std::string("config.json: field '") + key + "': expected a positive integer");
  return config[key].get<int64_t>();
}

// id2label in id order; ids must be 0..n-1.
std::vector<std::string> Labels(const nlohmann::json& config) {
  if (!config.contains("id2label") || !config["id2label"].is_object() || config["id2label"].empty())
    throw std::runtime_error("config.json: field 'id2label': expected the classifier's labels");
  std::vector<std::string> labels(config["id2label"].size());
  for (const auto& [key, value] : config["id2label"].items()) {
    size_t id = labels.size();
    try {
      id = std::stoul(key);
    } catch (const std::exception&) {
    }
    if (id >= labels.size() || !value.is_string() || !labels[id].empty())
      throw std::runtime_error("config.json: field 'id2label': expected ids 0.." + std::to_string(labels.size() - 1) +
                               " each with a label, got '" + key + "'");
    labels[id] = value.get<std::string>();
  }
  return labels;
}

void CheckClassifier(const nlohmann::json& config) {
  if (!config.contains("architectures") || !config["architectures"].is_array()) return;
  for (const auto& name : config["architectures"])
    if (name.is_string() && name.get<std::string>().find("ForSequenceClassification") == std::string::npos)
      throw std::runtime_error("config.json: field 'architectures': " + name.get<std::string>() +
                               " is not a sequence classifier (serving answers logits and labels)");
}

}  // namespace

bool IsModelName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

std::vector<RepositoryEntry> ScanRepository(const std::string& root) {
  std::vector<RepositoryEntry> entries;
  std::error_code error;
  for (const auto& model : fs::directory_iterator(root, error)) {
    const std::string name = model.path().filename().string();
    if (!IsModelName(name) || !model.is_directory(error)) continue;
    for (const auto& version : fs::directory_iterator(model.path(), error)) {
      int64_t number = 0;
      if (version.is_directory(error) && ParseVersion(version.path().filename().string(), &number))
        entries.push_back({name, number, version.path().string()});
    }
  }
  std::sort(entries.begin(), entries.end(), [](const RepositoryEntry& a, const RepositoryEntry& b) {
    return a.model != b.model ? a.model < b.model : a.version < b.version;
  });
  return entries;
}

VersionMeta ReadVersion(const RepositoryEntry& entry) {
  const fs::path folder(entry.path);
  const nlohmann::json config = ReadJsonFile(folder / "config.json");
  if (!config.is_object()) throw std::runtime_error("config.json: expected a JSON object");
  VersionMeta meta;
  meta.model = entry.model;
  meta.version = entry.version;
  meta.path = entry.path;
  meta.family = config.value("model_type", "");
  if (meta.family != "bert" && meta.family != "roberta" && meta.family != "distilbert" && meta.family != "gpt2")
    throw std::runtime_error("config.json: field 'model_type': '" + meta.family +
                             "' is not a family we serve (bert, roberta, distilbert, gpt2)");
  CheckClassifier(config);
  meta.labels = Labels(config);
  const int64_t positions = IntField(config, meta.family == "gpt2" ? "n_positions" : "max_position_embeddings");
  // RoBERTa's position ids start after the padding index.
  meta.max_tokens = static_cast<int>(meta.family == "roberta" ? positions - 2 : positions);
  if (meta.max_tokens < 2) throw std::runtime_error("config.json: too few positions to hold a text");
  meta.vocab_size = IntField(config, "vocab_size");
  meta.tokenizer = LoadTokenizer(folder, meta.family);
  // An id past the embedding table would fail the whole batch it rides in: refuse the
  // version now, with the reason, instead of every request batched with such a text.
  if (meta.tokenizer->vocab_size() > meta.vocab_size)
    throw std::runtime_error("the tokenizer has " + std::to_string(meta.tokenizer->vocab_size()) +
                             " tokens, but config.json's vocab_size is " + std::to_string(meta.vocab_size) +
                             ": its ids past " + std::to_string(meta.vocab_size - 1) + " have no embedding");
  meta.pad_id = meta.tokenizer->pad_id();
  if (config.contains("pad_token_id") && config["pad_token_id"].is_number_integer())
    meta.pad_id = config["pad_token_id"].get<int32_t>();
  if (meta.pad_id < 0 || meta.pad_id >= meta.vocab_size)
    throw std::runtime_error("config.json: pad_token_id " + std::to_string(meta.pad_id) + " is outside vocab_size " +
                             std::to_string(meta.vocab_size));
  SafetensorsFile::Read((folder / "model.safetensors").string());  // throws SafetensorsError naming the lie
  return meta;
}

}  // namespace trainyard
