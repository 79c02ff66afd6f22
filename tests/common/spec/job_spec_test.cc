#include "common/spec/job_spec.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class JobSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_spec_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "data");
    std::ofstream(dir_ / "data/train.tsv") << "label\ttext\na\thello\n";
    std::ofstream(dir_ / "data/vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  JobSpec Parse(const std::string& yaml) { return ParseJobSpec(yaml, "job.yaml", dir_.string()); }

  // The SpecError message for `yaml`, or "" if it parsed.
  std::string ErrorOf(const std::string& yaml) {
    try {
      Parse(yaml);
    } catch (const SpecError& e) {
      return e.what();
    }
    return "";
  }

  static std::string Valid(const std::string& extra_train = "") {
    return "name: t\n"
           "data:\n"
           "  train: data/train.tsv\n"
           "  tokenizer:\n"
           "    vocab: data/vocab.txt\n"
           "train:\n"
           "  epochs: 2\n" +
           extra_train;
  }

  fs::path dir_;
};

TEST_F(JobSpecTest, ValidFileGivesTypedSpecWithResolvedPaths) {
  JobSpec spec = Parse(Valid("  precision: bf16\n  lr: 3e-4\n"));
  EXPECT_EQ(spec.name, "t");
  EXPECT_EQ(spec.train.epochs, 2);
  EXPECT_EQ(spec.train.precision, Precision::kBf16);
  EXPECT_DOUBLE_EQ(spec.train.lr, 3e-4);
  EXPECT_EQ(spec.data.train, (dir_ / "data/train.tsv").string());
  EXPECT_EQ(spec.data.tokenizer.vocab, (dir_ / "data/vocab.txt").string());
  EXPECT_EQ(spec.Where("train.epochs"), "job.yaml:7:11: train.epochs");
}

TEST_F(JobSpecTest, MalformedYamlNamesLineAndColumn) {
  std::string error = ErrorOf("name: t\ndata: [unclosed\n");
  EXPECT_TRUE(error.rfind("job.yaml:", 0) == 0) << error;
  EXPECT_NE(error.find("malformed YAML"), std::string::npos) << error;
}

TEST_F(JobSpecTest, UnknownKeySuggestsNearestValidKey) {
  std::string error = ErrorOf(Valid("  epocs: 3\n"));
  EXPECT_EQ(error, "job.yaml:8:3: train.epocs: unknown key; did you mean 'epochs'?");
}

TEST_F(JobSpecTest, WrongTypeSaysWhatWasExpected) {
  std::string error = ErrorOf(Valid("  batch_size: large\n"));
  EXPECT_EQ(error, "job.yaml:8:15: train.batch_size: expected an integer, got 'large'");
}

TEST_F(JobSpecTest, NegativeEpochsAreOutOfRange) {
  std::string yaml = Valid();
  yaml.replace(yaml.find("epochs: 2"), 9, "epochs: -1");
  EXPECT_EQ(ErrorOf(yaml), "job.yaml:7:11: train.epochs: expected an integer >= 1, got -1");
}

TEST_F(JobSpecTest, MissingDatasetFileNamesTheKey) {
  std::string yaml = Valid();
  yaml.replace(yaml.find("data/train.tsv"), 14, "data/nope.tsv");
  std::string error = ErrorOf(yaml);
  EXPECT_EQ(error.rfind("job.yaml:3:10: data.train: file not found: ", 0), 0u) << error;
}

TEST_F(JobSpecTest, DuplicateKeyIsRejected) {
  std::string error = ErrorOf(Valid("  epochs: 3\n"));
  EXPECT_EQ(error, "job.yaml:8:3: train.epochs: duplicate key; each key may appear once");
}

TEST_F(JobSpecTest, EnumListsTheChoices) {
  std::string error = ErrorOf(Valid("  precision: fp8\n"));
  EXPECT_EQ(error, "job.yaml:8:14: train.precision: expected one of bf16, fp16, fp32, got 'fp8'");
}

TEST_F(JobSpecTest, MissingRequiredSectionIsReported) {
  std::string error = ErrorOf("name: t\n");
  EXPECT_NE(error.find("data: required"), std::string::npos) << error;
}

TEST_F(JobSpecTest, LoadJobSpecResolvesAgainstTheFilesFolder) {
  std::ofstream(dir_ / "job.yaml") << Valid();
  JobSpec spec = LoadJobSpec((dir_ / "job.yaml").string());
  EXPECT_EQ(spec.data.train, (dir_ / "data/train.tsv").string());
}

TEST_F(JobSpecTest, ShippedExampleJobParses) {
  // The README's job must stay valid; its data may not be prepared here, so only
  // the schema is checked (a missing file is the one error allowed).
  const std::string path = std::string(TRAINYARD_SOURCE_DIR) + "/configs/jobs/langid_tiny.yaml";
  try {
    LoadJobSpec(path);
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("file not found"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trainyard
