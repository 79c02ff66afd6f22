#include "data/wordpiece_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace trainyard {
namespace {

class WordPieceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / ("ty_vocab_" + std::to_string(::getpid()) + ".txt");
    std::ofstream out(path_);
    for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "hello", "world", "!", ",",
                          "cafe", "ni", "hao", "你", "好", "привет"})
      out << t << "\n";
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
};

TEST_F(WordPieceTest, BasicTokenizerLowersStripsAccentsAndSplitsPunctuation) {
  WordPieceTokenizer tok(path_.string(), true);
  EXPECT_EQ(tok.BasicTokenize("Héllo,  WORLD!"), (std::vector<std::string>{"hello", ",", "world", "!"}));
  EXPECT_EQ(tok.BasicTokenize("Café\u00a0你好"), (std::vector<std::string>{"cafe", "你", "好"}));
  EXPECT_EQ(tok.BasicTokenize("ПРИВЕТ\x01"), (std::vector<std::string>{"привет"}));
}

TEST_F(WordPieceTest, GreedyLongestMatchWithContinuations) {
  WordPieceTokenizer tok(path_.string(), true);
  EXPECT_EQ(tok.TokenIds("unaffable"), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(tok.TokenIds("unknownword"), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok.TokenIds(std::string(101, 'a')), (std::vector<int32_t>{1}));
}

TEST_F(WordPieceTest, EncodeAddsClsSepAndTruncates) {
  WordPieceTokenizer tok(path_.string(), true);
  EXPECT_EQ(tok.Encode("hello world !", 128), (std::vector<int32_t>{2, 7, 8, 9, 3}));
  EXPECT_EQ(tok.Encode("hello world !", 4), (std::vector<int32_t>{2, 7, 8, 3}));
}

// Encode tokenizes a long text a prefix at a time; it must give exactly the first
// pieces of the whole text, whatever sits at the cut: combining marks after a space,
// CJK, control characters, runs of whitespace, words over 100 characters.
TEST(WordPieceLongText, EncodeEqualsTheWholeTextsPiecesCut) {
  const auto path = std::filesystem::temp_directory_path() / ("ty_vocab_long_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(path);
    out << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n";
    for (char c = 'a'; c <= 'z'; ++c) out << c << "\n##" << c << "\n";
    for (const char* t : {"the", "cat", "##s", "你", "好", ",", "!", "e", "##e"}) out << t << "\n";
  }
  const std::vector<std::string> atoms = {"the",
                                          "cats",
                                          "Cat",
                                          "\xc3\x89t\xc3\xa9",
                                          " ",
                                          " ",
                                          "  ",
                                          "\t",
                                          "\n",
                                          "\xc2\xa0",
                                          "\xcc\x81",
                                          "\x01",
                                          "\xe4\xbd\xa0\xe5\xa5\xbd",
                                          ",",
                                          "!",
                                          "e\xcc\x81",
                                          "\xf0\x9f\x99\x82",
                                          std::string(120, 'x'),
                                          "z"};
  std::mt19937 rng(7);
  for (bool lowercase : {true, false}) {
    WordPieceTokenizer tok(path.string(), lowercase);
    for (int trial = 0; trial < 60; ++trial) {
      std::string text;
      const size_t target = std::uniform_int_distribution<size_t>(0, 9000)(rng);
      while (text.size() < target) text += atoms[std::uniform_int_distribution<size_t>(0, atoms.size() - 1)(rng)];
      const std::vector<int32_t> whole = tok.TokenIds(text);
      for (int max_len : {1, 2, 3, 8, 40, 130, 514}) {
        const std::vector<int32_t> expected = WrapWithClsSep(whole, 2, 3, max_len);
        ASSERT_EQ(tok.Encode(text, max_len), expected)
            << "lowercase " << lowercase << ", trial " << trial << ", " << text.size() << " bytes, max_len " << max_len;
      }
    }
  }
  std::filesystem::remove(path);
}

TEST_F(WordPieceTest, CasedModeKeepsAccents) {
  WordPieceTokenizer tok(path_.string(), false);
  EXPECT_EQ(tok.BasicTokenize("Café"), (std::vector<std::string>{"Café"}));
}

}  // namespace
}  // namespace trainyard
