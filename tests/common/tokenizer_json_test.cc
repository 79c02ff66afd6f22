// tokenizer.json read as the classic files (common/tokenizer_json.h): what each supported
// model becomes, and each refusal with the field that decides it. Parity with Hugging
// Face's own reading of real files is tests/reference/tokenizer_json_parity.py.
#include "common/tokenizer_json.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace trainyard {
namespace {

const char* const kBert = R"({
  "added_tokens": [{"id": 0, "content": "[PAD]"}, {"id": 5, "content": "[MASK]"}],
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                 "strip_accents": null, "lowercase": false},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "##s": 4}}})";

std::string ErrorOf(const std::string& json) {
  try {
    ConvertTokenizerJson(json, "t.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

// kBert with `from` replaced by `to` (which must occur once).
std::string Bert(const std::string& from, const std::string& to) {
  std::string json = kBert;
  const size_t at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? json : json.replace(at, from.size(), to);
}

TEST(TokenizerJsonTest, AWordPieceModelIsVocabTxtInIdOrderWithItsAddedTokens) {
  const HfTokenizerFiles files = ConvertTokenizerJson(kBert, "t.json");
  EXPECT_EQ(files.model, HfTokenizerFiles::Model::kWordPiece);
  EXPECT_EQ(files.vocab, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n##s\n[MASK]\n");
  EXPECT_FALSE(files.lowercase);
  EXPECT_TRUE(ConvertTokenizerJson(Bert(R"("lowercase": false)", R"("lowercase": true)"), "t.json").lowercase);
}

TEST(TokenizerJsonTest, AByteLevelBpeModelIsVocabJsonAndMergesTxtFromEitherMergeForm) {
  const std::string pairs = R"({"normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
      "use_regex": true}, "model": {"type": "BPE", "dropout": null, "continuing_subword_prefix": "",
      "end_of_word_suffix": "", "byte_fallback": false, "ignore_merges": false,
      "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
      "added_tokens": [{"id": 3, "content": "<|endoftext|>"}]})";
  const HfTokenizerFiles files = ConvertTokenizerJson(pairs, "t.json");
  EXPECT_EQ(files.model, HfTokenizerFiles::Model::kByteLevelBpe);
  EXPECT_EQ(files.vocab, "{\"<|endoftext|>\":3,\"a\":0,\"ab\":2,\"b\":1}\n");
  EXPECT_EQ(files.merges, "#version: 0.2\na b\n");
  EXPECT_FALSE(files.add_prefix_space);
  std::string strings = pairs;
  strings.replace(strings.find(R"([["a", "b"]])"), 12, R"(["a b"])");
  EXPECT_EQ(ConvertTokenizerJson(strings, "t.json").merges, files.merges);
  // The ByteLevel pre-tokenizer's own default is a prefix space.
  EXPECT_TRUE(ConvertTokenizerJson(R"({"pre_tokenizer": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
                                   "t.json")
                  .add_prefix_space);
}

TEST(TokenizerJsonTest, WhatIsNotTokenizedHereAsHuggingFaceWouldIsRefusedByItsField) {
  EXPECT_EQ(ErrorOf(R"({"model": {"type": "Unigram"}})"),
            "t.json: model.type: \"Unigram\" is not read here; only WordPiece and byte-level BPE are");
  EXPECT_EQ(ErrorOf(Bert(R"("strip_accents": null)", R"("strip_accents": true)")),
            "t.json: normalizer.strip_accents: only accents stripped with lowercase (null, or equal to lowercase)");
  EXPECT_EQ(ErrorOf(Bert(R"("type": "BertPreTokenizer")", R"("type": "Whitespace")")),
            "t.json: pre_tokenizer: a WordPiece model is read with \"BertPreTokenizer\" only");
  EXPECT_EQ(ErrorOf(Bert(R"("continuing_subword_prefix": "##")", R"("continuing_subword_prefix": "@@")")),
            "t.json: model.continuing_subword_prefix: only \"##\" is supported here, got \"@@\"");
  EXPECT_EQ(ErrorOf(Bert(R"("max_input_chars_per_word": 100)", R"("max_input_chars_per_word": 200)")),
            "t.json: model.max_input_chars_per_word: only 100 is supported, got 200");
  EXPECT_EQ(ErrorOf(Bert(R"("##s": 4)", R"("##s": 7)")),
            "t.json: model.vocab: ids must run from 0 to 5 without a gap; \"##s\" has 7");
  const std::string shared = ErrorOf(Bert(R"("##s": 4)", R"("##s": 3)"));
  EXPECT_EQ(shared.rfind("t.json: model.vocab: ", 0), 0u) << shared;
  EXPECT_NE(shared.find("share id 3"), std::string::npos) << shared;
  EXPECT_EQ(ErrorOf(Bert(R"("##s": 4)", R"("a\nb": 4)")),
            "t.json: model.vocab: \"a\\nb\": a WordPiece token cannot hold a line break");
  const std::string bpe = R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0}, )";
  EXPECT_EQ(ErrorOf(bpe + R"("merges": [], "dropout": 0.1}})"),
            "t.json: model.dropout: BPE dropout is not supported, got 0.1");
  EXPECT_EQ(ErrorOf(bpe + R"("merges": [], "ignore_merges": true}})"),
            "t.json: model.ignore_merges: only false is supported");
  EXPECT_EQ(ErrorOf(bpe + R"("merges": ["ab"]}})"), "t.json: model.merges[0]: expected \"a b\", got \"ab\"");
  EXPECT_EQ(ErrorOf(bpe + R"("merges": [["a", "b", "c"]]}})"),
            "t.json: model.merges[0]: expected \"a b\" or [\"a\", \"b\"], got [\"a\",\"b\",\"c\"]");
  EXPECT_EQ(ErrorOf(R"({"pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "BPE"}})"),
            "t.json: pre_tokenizer: a BPE model is read with a \"ByteLevel\" pre-tokenizer only (byte-level BPE)");
  EXPECT_EQ(ErrorOf(R"({"normalizer": {"type": "NFC"}, "model": {"type": "BPE"}})"),
            "t.json: normalizer: a byte-level BPE model is read without a normalizer (null) only");
}

TEST(TokenizerJsonTest, BytesThatAreNotATokenizerJsonAreRefusedWithoutRecursion) {
  EXPECT_EQ(ErrorOf("[1, 2]"), "t.json: model: required: the tokenizer's model");
  EXPECT_EQ(ErrorOf(R"({"model": 3})"), "t.json: model: expected an object with a \"type\"");
  EXPECT_EQ(ErrorOf("{\"model\": ").rfind("t.json: not a tokenizer.json: ", 0), 0u);
  EXPECT_EQ(ErrorOf(std::string(1000000, '[')).rfind("t.json: not a tokenizer.json: ", 0), 0u);
  EXPECT_EQ(ErrorOf(Bert(R"("##s": 4)", R"("##s": -4)")),
            "t.json: model.vocab: token \"##s\": expected an id of at least 0, got -4");
  EXPECT_EQ(ErrorOf(Bert(R"({"id": 5, "content": "[MASK]"})", R"({"id": 5})")),
            "t.json: added_tokens[1]: expected {\"id\": an id, \"content\": a string}");
}

TEST(TokenizerJsonTest, AMissingFileIsNamed) {
  try {
    ReadTokenizerJson("/nonexistent/tokenizer.json");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("/nonexistent/tokenizer.json", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace trainyard
