#include "common/tokenizer_json.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/bounded_json.h"
#include "common/regular_file.h"

namespace trainyard {
namespace {

using Json = nlohmann::json;

class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  [[noreturn]] void Refuse(const std::string& field, const std::string& what) const {
    throw std::runtime_error(source_ + ": " + field + ": " + what);
  }

  // The member `key` of `object`, or nullptr where it is absent or null.
  static const Json* Member(const Json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }

  // A component's "type" ("" for an absent or null component).
  std::string TypeOf(const Json* component, const std::string& field) const {
    if (!component) return "";
    const Json* type = Member(*component, "type");
    if (!component->is_object() || !type || !type->is_string()) Refuse(field, "expected an object with a \"type\"");
    return type->get<std::string>();
  }

  bool Flag(const Json& object, const char* key, bool fallback, const std::string& field) const {
    const Json* value = Member(object, key);
    if (!value) return fallback;
    if (!value->is_boolean()) Refuse(field + "." + key, "expected true or false, got " + value->dump());
    return value->get<bool>();
  }

  // A string member that may only take `wanted` (or be absent, null or, where
  // `empty_ok`, "").
  void Expect(const Json& object, const char* key, const std::string& wanted, const std::string& field,
              bool empty_ok = false) const {
    const Json* value = Member(object, key);
    if (!value || (empty_ok && value->is_string() && value->get<std::string>().empty())) return;
    if (!value->is_string() || value->get<std::string>() != wanted)
      Refuse(field + "." + key, "only \"" + wanted + "\" is supported here, got " + value->dump());
  }

 private:
  const std::string& source_;
};

// The model's vocabulary with the added tokens it lacks, as token -> id.
std::unordered_map<std::string, int64_t> Vocabulary(const Json& root, const Json& model, const Reader& r) {
  const Json* vocab = Reader::Member(model, "vocab");
  if (!vocab || !vocab->is_object() || vocab->empty())
    r.Refuse("model.vocab", "expected a non-empty object of {\"token\": id}");
  std::unordered_map<std::string, int64_t> ids;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      r.Refuse("model.vocab", "token " + Json(token).dump() + ": expected an id of at least 0, got " + id.dump());
    ids[token] = id.get<int64_t>();
  }
  const Json* added = Reader::Member(root, "added_tokens");
  if (added && !added->is_array()) r.Refuse("added_tokens", "expected an array");
  for (size_t i = 0; added && i < added->size(); ++i) {
    const Json& token = (*added)[i];
    const Json* content = Reader::Member(token, "content");
    const Json* id = Reader::Member(token, "id");
    if (!content || !content->is_string() || !id || !id->is_number_integer() || id->get<int64_t>() < 0)
      r.Refuse("added_tokens[" + std::to_string(i) + "]", "expected {\"id\": an id, \"content\": a string}");
    ids.emplace(content->get<std::string>(), id->get<int64_t>());
  }
  return ids;
}

// vocab.txt: ids 0..N-1 each held by exactly one token, a token a line.
std::string VocabTxt(const std::unordered_map<std::string, int64_t>& ids, const Reader& r) {
  std::vector<const std::string*> by_id(ids.size(), nullptr);
  for (const auto& [token, id] : ids) {
    if (id >= int64_t(by_id.size()))
      r.Refuse("model.vocab", "ids must run from 0 to " + std::to_string(by_id.size() - 1) + " without a gap; " +
                                  Json(token).dump() + " has " + std::to_string(id));
    if (by_id[size_t(id)])
      r.Refuse("model.vocab",
               Json(token).dump() + " and " + Json(*by_id[size_t(id)]).dump() + " share id " + std::to_string(id));
    if (token.find_first_of("\r\n") != std::string::npos)
      r.Refuse("model.vocab", Json(token).dump() + ": a WordPiece token cannot hold a line break");
    by_id[size_t(id)] = &token;
  }
  std::string text;
  for (const std::string* token : by_id) text += *token + "\n";
  return text;
}

HfTokenizerFiles WordPiece(const Json& root, const Json& model, const Reader& r) {
  const Json* normalizer = Reader::Member(root, "normalizer");
  if (r.TypeOf(normalizer, "normalizer") != "BertNormalizer")
    r.Refuse("normalizer", "a WordPiece model is read with BERT's normalizer (\"BertNormalizer\") only");
  HfTokenizerFiles files;
  files.lowercase = r.Flag(*normalizer, "lowercase", true, "normalizer");
  // The WordPiece tokenizer here strips accents exactly when it lower-cases (BERT's rule).
  if (r.Flag(*normalizer, "strip_accents", files.lowercase, "normalizer") != files.lowercase)
    r.Refuse("normalizer.strip_accents", "only accents stripped with lowercase (null, or equal to lowercase)");
  if (!r.Flag(*normalizer, "clean_text", true, "normalizer") ||
      !r.Flag(*normalizer, "handle_chinese_chars", true, "normalizer"))
    r.Refuse("normalizer", "clean_text and handle_chinese_chars off are not supported");
  if (r.TypeOf(Reader::Member(root, "pre_tokenizer"), "pre_tokenizer") != "BertPreTokenizer")
    r.Refuse("pre_tokenizer", "a WordPiece model is read with \"BertPreTokenizer\" only");
  r.Expect(model, "continuing_subword_prefix", "##", "model");
  r.Expect(model, "unk_token", "[UNK]", "model");
  const Json* max_chars = Reader::Member(model, "max_input_chars_per_word");
  if (max_chars && *max_chars != Json(100))
    r.Refuse("model.max_input_chars_per_word", "only 100 is supported, got " + max_chars->dump());
  files.model = HfTokenizerFiles::Model::kWordPiece;
  files.vocab = VocabTxt(Vocabulary(root, model, r), r);
  return files;
}

// One merge, "a b" or ["a", "b"] (tokenizers 0.20 and later), as merges.txt's line.
std::string MergeLine(const Json& merge, size_t index, const Reader& r) {
  const std::string field = "model.merges[" + std::to_string(index) + "]";
  std::string left, right;
  if (merge.is_string()) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    if (space == std::string::npos) r.Refuse(field, "expected \"a b\", got " + merge.dump());
    left = text.substr(0, space);
    right = text.substr(space + 1);
  } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    left = merge[0].get<std::string>();
    right = merge[1].get<std::string>();
  } else {
    r.Refuse(field, "expected \"a b\" or [\"a\", \"b\"], got " + merge.dump());
  }
  if (left.empty() || right.empty() || (left + right).find_first_of(" \r\n") != std::string::npos)
    r.Refuse(field, "expected two non-empty tokens without spaces or line breaks, got " + merge.dump());
  return left + " " + right + "\n";
}

HfTokenizerFiles ByteLevelBpe(const Json& root, const Json& model, const Reader& r) {
  if (Reader::Member(root, "normalizer"))
    r.Refuse("normalizer", "a byte-level BPE model is read without a normalizer (null) only");
  const Json* pre = Reader::Member(root, "pre_tokenizer");
  if (r.TypeOf(pre, "pre_tokenizer") != "ByteLevel")
    r.Refuse("pre_tokenizer", "a BPE model is read with a \"ByteLevel\" pre-tokenizer only (byte-level BPE)");
  if (!r.Flag(*pre, "use_regex", true, "pre_tokenizer"))
    r.Refuse("pre_tokenizer.use_regex", "only true (GPT-2's split) is supported");
  HfTokenizerFiles files;
  files.model = HfTokenizerFiles::Model::kByteLevelBpe;
  files.add_prefix_space = r.Flag(*pre, "add_prefix_space", true, "pre_tokenizer");  // HF's default
  if (const Json* dropout = Reader::Member(model, "dropout"); dropout && *dropout != Json(0) && *dropout != Json(0.0))
    r.Refuse("model.dropout", "BPE dropout is not supported, got " + dropout->dump());
  if (r.Flag(model, "byte_fallback", false, "model")) r.Refuse("model.byte_fallback", "only false is supported");
  // With ignore_merges a word found whole in the vocabulary skips the merges (Llama 3).
  if (r.Flag(model, "ignore_merges", false, "model")) r.Refuse("model.ignore_merges", "only false is supported");
  r.Expect(model, "continuing_subword_prefix", "", "model", true);
  r.Expect(model, "end_of_word_suffix", "", "model", true);
  files.vocab = Json(Vocabulary(root, model, r)).dump() + "\n";
  const Json* merges = Reader::Member(model, "merges");
  if (!merges || !merges->is_array()) r.Refuse("model.merges", "expected an array of merges");
  files.merges = "#version: 0.2\n";
  for (size_t i = 0; i < merges->size(); ++i) files.merges += MergeLine((*merges)[i], i, r);
  return files;
}

}  // namespace

HfTokenizerFiles ConvertTokenizerJson(std::string_view json_text, const std::string& source) {
  Reader r(source);
  Json root;
  try {
    root = ParseBoundedJson(json_text);
  } catch (const std::exception& e) {
    throw std::runtime_error(source + ": not a tokenizer.json: " + e.what());
  }
  const Json* model = Reader::Member(root, "model");
  if (!root.is_object() || !model) r.Refuse("model", "required: the tokenizer's model");
  const std::string type = r.TypeOf(model, "model");
  if (type == "WordPiece") return WordPiece(root, *model, r);
  if (type == "BPE") return ByteLevelBpe(root, *model, r);
  r.Refuse("model.type", "\"" + type + "\" is not read here; only WordPiece and byte-level BPE are");
}

HfTokenizerFiles ReadTokenizerJson(const std::string& path) {
  FileRead read = ReadUserFile(path, kMaxTokenizerJsonBytes);
  if (!read.ok()) throw std::runtime_error(read.why);
  return ConvertTokenizerJson(read.bytes, path);
}

}  // namespace trainyard
