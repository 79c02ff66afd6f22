#include "data/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "data/text_dataset.h"
#include "tests/common/source_path.h"

namespace trainyard {
namespace {

// Trains a real model with libsentencepiece on the fortunes the data step prepared.
TEST(SentencePieceTokenizer, TrainsFromTextsAndEncodesWithClsSep) {
  const std::string train = SourcePath("data/prepared/langid/train.tsv");
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

std::string FileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every rank of a job trains the model when it is missing, possibly at the same time:
// concurrent trainings must leave one whole model, with the pieces and scores one
// training alone makes (the model file also names its training paths, which differ).
TEST(SentencePieceTokenizer, ConcurrentTrainingsLeaveOneIdenticalModel) {
  const std::string train = SourcePath("data/prepared/langid/train.tsv");
  if (!std::filesystem::exists(train)) GTEST_SKIP() << "run scripts/prepare_data.py first";
  LabelSet labels;
  TextDataset data = ReadTextDataset(train, {}, &labels);
  std::vector<std::string> texts;
  for (size_t i = 0; i < 1000; ++i) texts.push_back(data.examples[i].text);
  const auto dir = std::filesystem::temp_directory_path() / ("ty_sp_concurrent_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  SentencePieceTokenizer::Train(texts, (dir / "alone.model").string(), 300);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&] { SentencePieceTokenizer::Train(texts, (dir / "shared.model").string(), 300); });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(FileBytes(dir / "shared.vocab"), FileBytes(dir / "alone.vocab"));  // pieces and scores
  EXPECT_EQ(SentencePieceTokenizer((dir / "shared.model").string()).vocab_size(), 300);
  size_t leftovers = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    leftovers += entry.path().string().find(".tmp-") != std::string::npos;
  EXPECT_EQ(leftovers, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainyard
