// The model repository a serve job reads (worker/serve/model_repository.h): which folders
// count as versions, and every reason a version folder is refused, each named in the
// message the repository index reports.
#include "worker/serve/model_repository.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "tests/common/scratch_dir.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json BertConfig() {
  return {{"model_type", "bert"},
          {"architectures", {"BertForSequenceClassification"}},
          {"id2label", {{"1", "yes"}, {"0", "no"}}},
          {"max_position_embeddings", 32},
          {"vocab_size", 16},
          {"pad_token_id", 0}};
}

class ModelRepositoryTest : public ::testing::Test {
 protected:
  // A version folder as a finetune job writes one, with `config` as its config.json.
  RepositoryEntry Version(const json& config, int version = 1) {
    const fs::path folder = root_ / "m" / std::to_string(version);
    fs::create_directories(folder);
    std::ofstream(folder / "config.json") << config.dump();
    std::ofstream(folder / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n";
    const float weight[2] = {0, 0};
    WriteSafetensors((folder / "model.safetensors").string(), {{"w", "F32", {2}, weight}}, {});
    return {"m", version, folder.string()};
  }

  // ReadVersion's refusal of `entry`, or "" when it reads.
  static std::string Refusal(const RepositoryEntry& entry) {
    try {
      ReadVersion(entry);
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  ScratchDir scratch_{"ty_model_repository_test"};
  const fs::path root_ = scratch_.path();
};

TEST_F(ModelRepositoryTest, ScanFindsModelsAndVersionsByTheLayoutOnlyInOrder) {
  for (const char* folder : {"good/1", "good/10", "good/2", "other.v2/7", "bad name/1", "m/01", "m/0", "m/abc",
                             "m/12345678901", "m/1000000001", "m/3"})
    fs::create_directories(root_ / folder);
  std::ofstream(root_ / "m" / "4") << "a file, not a version folder";
  std::ofstream(root_ / "loose.txt") << "a file, not a model folder";
  const std::vector<RepositoryEntry> found = ScanRepository(root_.string());
  std::vector<std::string> names;
  for (const RepositoryEntry& e : found) names.push_back(e.model + "/" + std::to_string(e.version));
  EXPECT_EQ(names, (std::vector<std::string>{"good/1", "good/2", "good/10", "m/3", "other.v2/7"}));
  EXPECT_EQ(found[0].path, (root_ / "good" / "1").string());
  EXPECT_TRUE(ScanRepository((root_ / "nowhere").string()).empty());
}

TEST_F(ModelRepositoryTest, ModelNamesAreTheLayoutsCharactersOnly) {
  EXPECT_TRUE(IsModelName("langid-tiny_v2.1"));
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "a/b", "a b", "\xc3\xa9", std::string(129, 'a')})
    EXPECT_FALSE(IsModelName(bad)) << bad;
  EXPECT_TRUE(IsModelName(std::string(128, 'a')));
}

TEST_F(ModelRepositoryTest, AFinetunedFolderReadsWithItsLabelsInIdOrder) {
  const VersionMeta meta = ReadVersion(Version(BertConfig(), 3));
  EXPECT_EQ(meta.model, "m");
  EXPECT_EQ(meta.version, 3);
  EXPECT_EQ(meta.family, "bert");
  EXPECT_EQ(meta.labels, (std::vector<std::string>{"no", "yes"}));
  EXPECT_EQ(meta.max_tokens, 32);
  EXPECT_EQ(meta.vocab_size, 16);
  EXPECT_EQ(meta.pad_id, 0);
  ASSERT_TRUE(meta.tokenizer);
  EXPECT_EQ(meta.tokenizer->vocab_size(), 7);
}

TEST_F(ModelRepositoryTest, EveryBadConfigIsRefusedWithItsReason) {
  struct Case {
    const char* what;
    json config;
    const char* reason;
  };
  auto with = [](const char* key, json value) {
    json c = BertConfig();
    c[key] = std::move(value);
    return c;
  };
  auto without = [](const char* key) {
    json c = BertConfig();
    c.erase(key);
    return c;
  };
  const std::vector<Case> cases = {
      {"not an object", json::array({1, 2}), "config.json: expected a JSON object"},
      {"another family", with("model_type", "t5"), "'t5' is not a family we serve"},
      {"no family", without("model_type"), "is not a family we serve"},
      {"not a classifier", with("architectures", {"BertForMaskedLM"}), "BertForMaskedLM is not a sequence classifier"},
      {"no labels", without("id2label"), "field 'id2label': expected the classifier's labels"},
      {"labels with a gap", with("id2label", {{"0", "a"}, {"2", "b"}}), "expected ids 0..1 each with a label, got '2'"},
      {"a label twice", with("id2label", {{"0", "a"}, {"00", "b"}}), "expected ids 0..1"},
      {"a label not text", with("id2label", {{"0", "a"}, {"1", 7}}), "expected ids 0..1"},
      {"no positions", without("max_position_embeddings"), "'max_position_embeddings': expected a positive integer"},
      {"one position", with("max_position_embeddings", 1), "too few positions to hold a text"},
      {"positions not a number", with("max_position_embeddings", "32"), "expected a positive integer"},
      {"vocabulary smaller than the tokenizer's", with("vocab_size", 5),
       "the tokenizer has 7 tokens, but config.json's vocab_size is 5: its ids past 4 have no embedding"},
      {"padding outside the vocabulary", with("pad_token_id", 16), "pad_token_id 16 is outside vocab_size 16"},
  };
  for (const Case& c : cases) {
    fs::remove_all(root_ / "m");
    const std::string refusal = Refusal(Version(c.config));
    EXPECT_NE(refusal.find(c.reason), std::string::npos) << c.what << ": " << refusal;
  }
}

TEST_F(ModelRepositoryTest, AFolderWhoseOnlyTokenizerIsTokenizerJsonReadsIt) {
  const RepositoryEntry entry = Version(BertConfig());
  const fs::path folder = entry.path;
  const std::vector<int32_t> from_vocab_txt = ReadVersion(entry).tokenizer->Encode("Hello worlds", 16);
  fs::remove(folder / "vocab.txt");
  std::ofstream(folder / "tokenizer.json") << R"({"normalizer": {"type": "BertNormalizer", "lowercase": true},
      "pre_tokenizer": {"type": "BertPreTokenizer"}, "model": {"type": "WordPiece", "vocab": {"[PAD]": 0,
      "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "hello": 5, "world": 6}}})";
  const VersionMeta meta = ReadVersion(entry);
  ASSERT_TRUE(meta.tokenizer);
  EXPECT_EQ(meta.tokenizer->Encode("Hello worlds", 16), from_vocab_txt);
  json gpt2 = BertConfig();
  gpt2["model_type"] = "gpt2";
  gpt2["architectures"] = {"GPT2ForSequenceClassification"};
  gpt2["n_positions"] = 32;
  std::ofstream(folder / "config.json") << gpt2.dump();
  EXPECT_EQ(Refusal(entry), "tokenizer.json: a gpt2 model needs a byte-level BPE tokenizer");
}

TEST_F(ModelRepositoryTest, MissingOrBrokenFilesAreRefusedWithTheirNames) {
  const RepositoryEntry entry = Version(BertConfig());
  const fs::path folder = entry.path;

  std::ofstream(folder / "config.json") << "{\"model_type\": ";
  EXPECT_NE(Refusal(entry).find("config.json: not valid JSON"), std::string::npos) << Refusal(entry);
  fs::remove(folder / "config.json");
  EXPECT_EQ(Refusal(entry), "config.json: missing");

  std::ofstream(folder / "config.json") << BertConfig().dump();
  std::ofstream(folder / "tokenizer_config.json") << "[not json";
  EXPECT_NE(Refusal(entry).find("tokenizer_config.json: not valid JSON"), std::string::npos) << Refusal(entry);
  fs::remove(folder / "tokenizer_config.json");
  fs::remove(folder / "vocab.txt");
  EXPECT_EQ(Refusal(entry), "vocab.txt: missing (a WordPiece vocabulary)");

  json gpt2 = BertConfig();
  gpt2["model_type"] = "gpt2";
  gpt2["architectures"] = {"GPT2ForSequenceClassification"};
  gpt2["n_positions"] = 32;
  std::ofstream(folder / "config.json") << gpt2.dump();
  EXPECT_EQ(Refusal(entry), "vocab.json: missing (byte-level BPE)");

  std::ofstream(folder / "config.json") << BertConfig().dump();
  std::ofstream(folder / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  fs::remove(folder / "model.safetensors");
  EXPECT_NE(Refusal(entry).find("model.safetensors"), std::string::npos) << Refusal(entry);
  std::ofstream(folder / "model.safetensors") << std::string(8, '\xff') << "{}";
  EXPECT_NE(Refusal(entry).find("model.safetensors"), std::string::npos) << Refusal(entry);
}

}  // namespace
}  // namespace trainyard
