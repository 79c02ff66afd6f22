#include "data/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/text_dataset.h"

namespace trainyard {
namespace {

// Trains a real model with libsentencepiece on the fortunes the data step prepared.
TEST(SentencePieceTokenizer, TrainsFromTextsAndEncodesWithClsSep) {
  const std::string train = std::string(TRAINYARD_SOURCE_DIR) + "/data/prepared/langid/train.tsv";
  if (!std::filesystem::exists(train)) GTEST_SKIP() << "run scripts/prepare_data.py first";
  LabelSet labels;
  TextDataset data = ReadTextDataset(train, {}, &labels);
  std::vector<std::string> texts;
  for (size_t i = 0; i < 3000; ++i) texts.push_back(data.examples[i].text);
  const auto model = std::filesystem::temp_directory_path() / ("ty_sp_" + std::to_string(::getpid()) + ".model");
  SentencePieceTokenizer::Train(texts, model.string(), 1000);
  SentencePieceTokenizer tokenizer(model.string());
  EXPECT_EQ(tokenizer.vocab_size(), 1000);
  EXPECT_EQ(tokenizer.pad_id(), 0);
  auto ids = tokenizer.Encode("Der frühe Vogel fängt den Wurm.", 64);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 2);  // <s> as [CLS]
  EXPECT_EQ(ids.back(), 3);   // </s> as [SEP]
  EXPECT_EQ(tokenizer.Encode(texts[0] + texts[1] + texts[2], 16).size(), 16u);
  std::filesystem::remove(model);
  std::filesystem::remove(model.string().substr(0, model.string().size() - 6) + ".vocab");
}

}  // namespace
}  // namespace trainyard
