#include "data/byte_level_bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/spec/job_spec.h"
#include "data/text_dataset.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using Template = ByteLevelBpeTokenizer::Template;
using Words = std::vector<std::string>;

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// A small byte-level vocabulary in a temporary folder: RoBERTa's specials (ids 0..4),
// <|endoftext|> (5), the 256 byte characters, then one token per merge.
class ByteLevelBpeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_bpe_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    WriteVocabulary({"<s>", "<pad>", "</s>", "<unk>", "<mask>", "<|endoftext|>"});
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes vocab.json (`specials` first) and merges.txt, with a "#version" line.
  void WriteVocabulary(const std::vector<std::string>& specials) {
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"Ġ", "w"}, {"o", "r"}, {"l", "d"},   {"Ġw", "or"},  {"Ġwor", "ld"},
        {"H", "e"}, {"l", "l"}, {"He", "ll"}, {"Hell", "o"}, {"Ġ", "Ġ"}};
    std::vector<std::string> tokens = specials;
    for (const auto& c : ByteLevelBpeTokenizer::ByteToUnicode()) tokens.push_back(c);
    for (const auto& [left, right] : merges) tokens.push_back(left + right);
    std::ofstream vocab(vocab_path());
    vocab << "{";
    for (size_t id = 0; id < tokens.size(); ++id) vocab << (id ? ", " : "") << JsonString(tokens[id]) << ": " << id;
    vocab << "}";
    std::ofstream out(merges_path());
    out << "#version: 0.2\n";
    for (const auto& [left, right] : merges) out << left << " " << right << "\n";
  }

  ByteLevelBpeTokenizer Make(Template t = Template::kAuto, bool add_prefix_space = false) const {
    return ByteLevelBpeTokenizer(vocab_path(), merges_path(), {add_prefix_space, t});
  }
  std::string vocab_path() const { return (dir_ / "vocab.json").string(); }
  std::string merges_path() const { return (dir_ / "merges.txt").string(); }
  static int32_t ByteId(char c) { return 6 + static_cast<unsigned char>(c); }

  fs::path dir_;
};

// The error message of constructing a tokenizer on the test folder, or "".
std::string ErrorOf(const std::string& vocab, const std::string& merges, Template t = Template::kAuto) {
  try {
    ByteLevelBpeTokenizer(vocab, merges, {false, t});
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// The UTF-8 of a code point below U+0800.
std::string Utf8(int c) {
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  return {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
}

TEST(ByteToUnicode, PrintableBytesStayOthersShiftAboveU0100) {
  const auto& table = ByteLevelBpeTokenizer::ByteToUnicode();
  std::set<std::string> distinct(table.begin(), table.end());
  EXPECT_EQ(distinct.size(), 256u);
  for (int b : {0x21, 0x41, 0x7E, 0xA1, 0xAC, 0xAE, 0xFF}) EXPECT_EQ(table[b], Utf8(b)) << b;
  EXPECT_EQ(table[0x00], "Ā");  // U+0100: the first of the 68 shifted bytes
  EXPECT_EQ(table[' '], "Ġ");   // U+0120
  EXPECT_EQ(table['\n'], "Ċ");  // U+010A
  EXPECT_EQ(table[0x7F], "ġ");  // U+0121, after the 33 control characters and space
  EXPECT_EQ(table[0xAD], "Ń");  // U+0143, the last
}

TEST(ByteLevelWords, WhitespaceRunsLeaveTheirLastSpaceToTheNextWord) {
  EXPECT_EQ(ByteLevelBpeTokenizer::ByteLevelWords("Hello  world   x\n\n y"),
            (Words{"Hello", "Ġ", "Ġworld", "ĠĠ", "Ġx", "ĊĊ", "Ġy"}));
  EXPECT_EQ(ByteLevelBpeTokenizer::ByteLevelWords("end  "), (Words{"end", "ĠĠ"}));
  EXPECT_EQ(ByteLevelBpeTokenizer::ByteLevelWords("x 42 ab3 !?"), (Words{"x", "Ġ42", "Ġab", "3", "Ġ!?"}));
  EXPECT_TRUE(ByteLevelBpeTokenizer::ByteLevelWords("").empty());
}

TEST(ByteLevelWords, ContractionsAreLowerCaseOnly) {
  EXPECT_EQ(ByteLevelBpeTokenizer::ByteLevelWords("it's IT'S we'll don't"),
            (Words{"it", "'s", "ĠIT", "'", "S", "Ġwe", "'ll", "Ġdon", "'t"}));
}

// Whitespace is Unicode's White_Space, as for HF's Oniguruma: "a <c>b" is four words
// when <c> is whitespace (" " then <c> alone), three when it is a symbol (" <c>").
TEST(ByteLevelWords, WhitespaceIsUnicodeWhiteSpace) {
  for (const char* c : {"\t", "\v", "\f", "\u0085", "\u00a0", "\u2028", "\u3000"})
    EXPECT_EQ(ByteLevelBpeTokenizer::ByteLevelWords(std::string("a ") + c + "b").size(), 4u) << c;
  for (const char* c : {"\x1c", "\u200b"})
    EXPECT_EQ(ByteLevelBpeTokenizer::ByteLevelWords(std::string("a ") + c + "b").size(), 3u) << c;
}

TEST_F(ByteLevelBpeTest, MergesLowestRankFirstLeftmostOnTies) {
  auto tok = Make(Template::kGpt2);
  EXPECT_EQ(tok.PieceStrings("Hello world"), (Words{"Hello", "Ġworld"}));
  EXPECT_EQ(tok.PieceStrings("world"), (Words{"w", "or", "ld"}));
  EXPECT_EQ(tok.PieceStrings("lll"), (Words{"ll", "l"}));
  EXPECT_EQ(tok.PieceStrings("Hellllo"), (Words{"Hell", "ll", "o"}));
  EXPECT_EQ(tok.PieceStrings("é"), (Words{"Ã", "©"}));  // two bytes, no merge
  EXPECT_EQ(tok.Pieces("x"), (std::vector<int32_t>{ByteId('x')}));
}

TEST_F(ByteLevelBpeTest, RobertaTemplateSplitsItsSpecialTokensOut) {
  auto tok = Make();
  EXPECT_EQ(tok.sequence_template(), Template::kRoberta);
  EXPECT_EQ(tok.Encode("a<s>b", 64), (std::vector<int32_t>{0, ByteId('a'), 0, ByteId('b'), 2}));
  EXPECT_EQ(tok.PieceStrings("x <pad></s>y"), (Words{"x", "Ġ", "<pad>", "</s>", "y"}));
  // <mask> takes the whitespace before it (lstrip); other tokens do not.
  EXPECT_EQ(tok.PieceStrings("a \n <mask>b"), (Words{"a", "<mask>", "b"}));
  EXPECT_EQ(tok.PieceStrings("<s>  <mask>"), (Words{"<s>", "<mask>"}));
  // <|endoftext|> is GPT-2's: plain text to RoBERTa.
  EXPECT_EQ(tok.PieceStrings("<|endoftext|>").front(), "<");
}

TEST_F(ByteLevelBpeTest, Gpt2TemplateSplitsOnlyEndOfText) {
  auto tok = Make(Template::kGpt2);
  EXPECT_EQ(tok.Encode("a<|endoftext|>b", 64), (std::vector<int32_t>{ByteId('a'), 5, ByteId('b')}));
  EXPECT_EQ(tok.PieceStrings("<s>"), (Words{"<", "s", ">"}));
  EXPECT_EQ(tok.bos_id(), 5);
  EXPECT_EQ(tok.eos_id(), 5);
  EXPECT_EQ(tok.pad_id(), 1);  // <pad> is in this vocabulary
}

TEST_F(ByteLevelBpeTest, PrefixSpaceGoesBeforeEachStretchBetweenSpecialTokens) {
  auto tok = Make(Template::kRoberta, true);
  EXPECT_EQ(tok.PieceStrings("a<s>b"), (Words{"Ġ", "a", "<s>", "Ġ", "b"}));  // no "Ġa" merge here
  EXPECT_EQ(tok.PieceStrings(" world"), (Words{"Ġworld"}));
  EXPECT_EQ(tok.PieceStrings("\nx"), (Words{"Ġ", "Ċ", "x"}));
  EXPECT_TRUE(tok.Pieces("").empty());
}

TEST_F(ByteLevelBpeTest, TemplatesTruncateThePieces) {
  auto roberta = Make(Template::kRoberta);
  EXPECT_EQ(roberta.Encode("", 8), (std::vector<int32_t>{0, 2}));
  auto ids = roberta.Encode("abcdefgh", 6);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, ByteId('a'), ByteId('b'), ByteId('c'), ByteId('d'), 2}));
  EXPECT_EQ(roberta.bos_id(), 0);
  EXPECT_EQ(roberta.eos_id(), 2);
  EXPECT_EQ(roberta.pad_id(), 1);
  auto gpt2 = Make(Template::kGpt2);
  EXPECT_TRUE(gpt2.Encode("", 8).empty());
  EXPECT_EQ(gpt2.Encode("abcdefgh", 3), (std::vector<int32_t>{ByteId('a'), ByteId('b'), ByteId('c')}));
  EXPECT_EQ(gpt2.vocab_size(), 6 + 256 + 10);
}

TEST_F(ByteLevelBpeTest, AutoTemplateFollowsTheVocabulary) {
  WriteVocabulary({"<|endoftext|>"});
  auto tok = Make();
  EXPECT_EQ(tok.sequence_template(), Template::kGpt2);
  EXPECT_EQ(tok.pad_id(), 0);  // no <pad>: <|endoftext|>, as HF's usual pad = eos
  EXPECT_NE(ErrorOf(vocab_path(), merges_path(), Template::kRoberta).find("vocab.json: the roberta template needs"),
            std::string::npos);
}

TEST_F(ByteLevelBpeTest, BadFilesAreNamedWithTheirLine) {
  std::ofstream(dir_ / "bad.txt") << "#version: 0.2\nH e\nl l l\n";
  EXPECT_NE(ErrorOf(vocab_path(), (dir_ / "bad.txt").string()).find("bad.txt:3: expected two tokens"),
            std::string::npos);
  std::ofstream(dir_ / "oov.txt") << "#version: 0.2\r\n\r\nH e\r\nq z\r\n";  // CRLF and a blank line
  EXPECT_NE(ErrorOf(vocab_path(), (dir_ / "oov.txt").string()).find("oov.txt:4: 'qz' is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(ErrorOf(vocab_path(), (dir_ / "none.txt").string()).find("none.txt: cannot open"), std::string::npos);
  std::ofstream(dir_ / "list.json") << "[1, 2]";
  EXPECT_NE(ErrorOf((dir_ / "list.json").string(), merges_path()).find("list.json: expected a non-empty JSON object"),
            std::string::npos);
  std::ofstream(dir_ / "neg.json") << R"({"a": -1})";
  EXPECT_NE(ErrorOf((dir_ / "neg.json").string(), merges_path()).find("neg.json: token 'a': expected an id"),
            std::string::npos);
}

// Texts that share words, so loader threads race on the same cache entries.
std::vector<std::string> MixedTexts(size_t count) {
  const std::vector<std::string> words = {"Hello",  " world",  "lll",     "  ", "\n",   "é",
                                          "你好",   "<s>",     " <mask>", "42", "it's", "<|endoftext|>",
                                          "\u3000", "Hellllo", "!?",      "x"};
  std::mt19937 random(7);
  std::vector<std::string> texts(count);
  for (auto& text : texts)
    for (size_t n = random() % 12; n > 0; --n) text += words[random() % words.size()];
  return texts;
}

TEST_F(ByteLevelBpeTest, ConcurrentEncodeGivesTheSameIds) {
  const std::vector<std::string> texts = MixedTexts(3000);
  const auto reference = Make();
  std::vector<std::vector<int32_t>> expected;
  expected.reserve(texts.size());
  for (const auto& text : texts) expected.push_back(reference.Encode(text, 64));
  const auto shared = Make();  // a fresh, empty cache
  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] {
      results[t].resize(texts.size());
      for (size_t i = 0; i < texts.size(); ++i) {
        const size_t k = (i + t * texts.size() / results.size()) % texts.size();  // each thread starts elsewhere
        results[t][k] = shared.Encode(texts[k], 64);
      }
    });
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST_F(ByteLevelBpeTest, JobSpecBuildsIt) {
  std::ofstream(dir_ / "train.tsv") << "label\ttext\na\thello\n";
  const std::string yaml =
      "name: t\ndata:\n  train: train.tsv\n  tokenizer:\n    kind: bpe\n    vocab: vocab.json\n"
      "    merges: merges.txt\n    template: gpt2\n    add_prefix_space: true\n";
  JobSpec spec = ParseJobSpec(yaml, "job.yaml", dir_.string());
  EXPECT_EQ(spec.data.tokenizer.merges, merges_path());
  auto tok = MakeTokenizer(spec.data, TextDataset{});
  // The prefix space, and <s> is plain text to GPT-2.
  EXPECT_EQ(tok->Encode("a<s>", 64),
            (std::vector<int32_t>{ByteId(' '), ByteId('a'), ByteId('<'), ByteId('s'), ByteId('>')}));
  auto error = [&](const std::string& text) {
    try {
      ParseJobSpec(text, "job.yaml", dir_.string());
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string no_merges = error(yaml.substr(0, yaml.find("    merges")));
  EXPECT_EQ(no_merges.rfind("job.yaml:", 0), 0u) << no_merges;
  EXPECT_NE(no_merges.find(": data.tokenizer.merges: required for a bpe tokenizer"), std::string::npos) << no_merges;
  std::string missing = yaml;
  missing.replace(missing.find("merges.txt"), 10, "gone.txt");
  EXPECT_NE(error(missing).find("job.yaml:7:13: data.tokenizer.merges: file not found"), std::string::npos)
      << error(missing);
  std::string bad_template = yaml;
  bad_template.replace(bad_template.find("gpt2"), 4, "bert");
  EXPECT_NE(error(bad_template).find("data.tokenizer.template: expected one of auto, gpt2, roberta"),
            std::string::npos);
}

}  // namespace
}  // namespace trainyard
