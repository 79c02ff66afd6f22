#include "data/text_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace trainyard {
namespace {

// The test files of this process, in one folder removed when the tests end.
const std::filesystem::path& Folder() {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ty_text_dataset_" + std::to_string(::getpid()));
  return dir;
}

class RemoveFolder : public ::testing::Environment {
 public:
  void TearDown() override { std::filesystem::remove_all(Folder()); }
};
[[maybe_unused]] const auto* const kRemoveFolder = ::testing::AddGlobalTestEnvironment(new RemoveFolder);

std::string Write(const std::string& name, const std::string& text) {
  std::filesystem::create_directories(Folder());
  auto path = Folder() / name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(TextDataset, TsvUnescapesAndCollectsSortedLabels) {
  LabelSet labels;
  auto data = ReadTextDataset(Write("a.tsv", "label\ttext\nb\tone\\ttab\\nline\na\ttwo\\\\\n"), {}, &labels);
  ASSERT_EQ(data.examples.size(), 2u);
  EXPECT_EQ(data.examples[0].text, "one\ttab\nline");
  EXPECT_EQ(data.examples[1].text, "two\\");
  EXPECT_EQ(labels.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(data.examples[0].label, 1);
}

// A labels file and a dataset saved with Windows line ends read as the same files.
TEST(TextDataset, CrlfLineEndsAreNotPartOfLabelsOrTexts) {
  LabelSet labels = LabelSet::FromFile(Write("crlf_labels.txt", "de\r\nen\r\n"));
  EXPECT_EQ(labels.names(), (std::vector<std::string>{"de", "en"}));
  auto data = ReadTextDataset(Write("crlf.tsv", "label\ttext\r\nen\thello\r\nde\thallo\r\n"), {}, &labels);
  ASSERT_EQ(data.examples.size(), 2u);
  EXPECT_EQ(data.examples[0].text, "hello");
  EXPECT_EQ(data.examples[1].label, 0);
}

TEST(TextDataset, JsonlReadsNamedFields) {
  LabelSet labels;
  TextFormat format{true, "body", "lang"};
  auto data = ReadTextDataset(Write("b.jsonl", "{\"body\": \"hi\", \"lang\": \"en\"}\n"), format, &labels);
  EXPECT_EQ(data.examples[0].text, "hi");
}

TEST(TextDataset, ErrorsNameFileAndLine) {
  LabelSet labels;
  const std::string tsv = Write("c.tsv", "label\ttext\na\tfine\nno tab here\n");
  try {
    ReadTextDataset(tsv, {}, &labels);
    FAIL();
  } catch (const DatasetError& e) {
    EXPECT_EQ(std::string(e.what()), tsv + ":3: expected 'label<TAB>text', found no tab");
  }
  LabelSet fixed({"x"});
  EXPECT_THROW(ReadTextDataset(Write("d.tsv", "label\ttext\ny\tz\n"), {}, &fixed), DatasetError);
  TextFormat jsonl{true, "text", "label"};
  EXPECT_THROW(ReadTextDataset(Write("e.jsonl", "{\"text\": 1}\n"), jsonl, &labels), DatasetError);
}

TEST(TextDataset, PlainTextIsOneUnlabelledTextALine) {
  LabelSet labels;
  TextFormat text;
  text.plain_text = true;
  TextDataset data = ReadTextDataset(Write("f.txt", "first\\nline\n\n  \nsecond\tx\r\n"), text, &labels);
  ASSERT_EQ(data.examples.size(), 2u);
  EXPECT_EQ(data.examples[0].text, "first\nline");
  EXPECT_EQ(data.examples[1].text, "second\tx");
  EXPECT_EQ(data.examples[0].label, -1);
  EXPECT_EQ(labels.size(), 0u);
  EXPECT_THROW(ReadTextDataset(Write("g.txt", "\n \n"), text, &labels), DatasetError);
}

}  // namespace
}  // namespace trainyard
