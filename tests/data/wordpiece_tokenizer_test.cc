#include "data/wordpiece_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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

TEST_F(WordPieceTest, CasedModeKeepsAccents) {
  WordPieceTokenizer tok(path_.string(), false);
  EXPECT_EQ(tok.BasicTokenize("Café"), (std::vector<std::string>{"Café"}));
}

}  // namespace
}  // namespace trainyard
