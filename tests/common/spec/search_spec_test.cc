#include "common/spec/search_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/source_path.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class SearchSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_search_spec_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "data");
    std::ofstream(dir_ / "data/train.tsv") << "label\ttext\na\thello\n";
    std::ofstream(dir_ / "data/dev.tsv") << "label\ttext\na\thello\n";
    std::ofstream(dir_ / "data/vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
    std::ofstream(dir_ / "base.yaml") << kBase;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static constexpr const char* kBase =
      "name: base\ndata:\n  train: data/train.tsv\n  dev: data/dev.tsv\n  tokenizer:\n    vocab: data/vocab.txt\n"
      "train:\n  epochs: 9\nresources:\n  ranks: 2\n";

  SearchSpec Parse(const std::string& search, const std::string& base = "base: base.yaml\n") {
    return ParseSearchSpec("name: s\nkind: search\n" + base + "search:\n" + search, "search.yaml", dir_.string());
  }
  std::string ErrorOf(const std::string& search, const std::string& base = "base: base.yaml\n") {
    try {
      Parse(search, base);
    } catch (const SpecError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(SearchSpecTest, RandomDrawsFollowSplitMix64InFileOrder) {
  const SearchSpec spec = Parse(
      "  method: random\n  max_trials: 3\n  seed: 5\n  params:\n    train.lr: {log_uniform: [1.0e-5, 1.0e-1]}\n"
      "    train.batch_size: {choice: [8, 16, 32]}\n    seed: {int_uniform: [1, 4]}\n"
      "    train.warmup_ratio: {uniform: [0.0, 0.5]}\n");
  ASSERT_EQ(spec.trials.size(), 3u);
  // The draws of SplitMix64 seeded with 5, computed here independently of the parser.
  uint64_t state = 5;
  auto next = [&] {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return double((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
  };
  const std::vector<std::string> batches = {"8", "16", "32"};
  for (const SearchTrial& t : spec.trials) {
    ASSERT_EQ(t.params.size(), 4u);
    EXPECT_EQ(t.params[0].first, "train.lr");
    EXPECT_DOUBLE_EQ(std::stod(t.params[0].second), std::exp(std::log(1e-5) + next() * std::log(1e4)));
    EXPECT_EQ(t.params[1].second, batches[size_t(next() * 3)]);
    EXPECT_EQ(std::stoi(t.params[2].second), 1 + int(next() * 4));
    EXPECT_DOUBLE_EQ(std::stod(t.params[3].second), next() * 0.5);
    EXPECT_DOUBLE_EQ(t.spec.train.lr, std::stod(t.params[0].second));
    EXPECT_EQ(t.spec.train.batch_size, std::stoi(t.params[1].second));
    EXPECT_EQ(t.spec.name, "s.t0" + std::to_string(t.index));
    EXPECT_EQ(t.spec.resources.ranks, 2);  // the base's keys stay
  }
  EXPECT_EQ(Parse("  method: random\n  max_trials: 3\n  seed: 5\n  params:\n    train.lr: {uniform: [0.1, 0.2]}\n")
                .trials[1]
                .params[0]
                .second,
            Parse("  method: random\n  max_trials: 3\n  seed: 5\n  params:\n    train.lr: {uniform: [0.1, 0.2]}\n")
                .trials[1]
                .params[0]
                .second);
}

TEST_F(SearchSpecTest, GridIsTheProductWithTheLastParameterFastest) {
  const SearchSpec spec =
      Parse("  method: grid\n  params:\n    train.lr: {choice: [1.0e-3, 2.0e-3]}\n    seed: {int_uniform: [1, 3]}\n");
  std::vector<std::string> got;
  for (const SearchTrial& t : spec.trials) got.push_back(t.params[0].second + "/" + t.params[1].second);
  EXPECT_EQ(got, (std::vector<std::string>{"1.0e-3/1", "1.0e-3/2", "1.0e-3/3", "2.0e-3/1", "2.0e-3/2", "2.0e-3/3"}));
  EXPECT_EQ(spec.trials[4].spec.seed, 2u);
}

TEST_F(SearchSpecTest, AshaSetsEpochsAndRungs) {
  const SearchSpec spec = Parse(
      "  method: asha\n  max_trials: 2\n  params:\n    train.lr: {choice: [1.0e-3]}\n"
      "  asha: {min_epochs: 1, reduction_factor: 3}\n");
  EXPECT_EQ(spec.asha.max_epochs, 9);  // the base's train.epochs
  EXPECT_EQ(spec.asha.Rungs(), (std::vector<int>{1, 3}));
  EXPECT_EQ(spec.trials[0].spec.train.epochs, 9);
  AshaSpec other{2, 2, 20};
  EXPECT_EQ(other.Rungs(), (std::vector<int>{2, 4, 8, 16}));
  EXPECT_TRUE(spec.maximize);  // eval_acc's default mode
}

TEST_F(SearchSpecTest, AnInlineBaseWorksAndItsErrorsPointAtIt) {
  const std::string inline_base =
      "base:\n  name: b\n  data: {train: data/train.tsv, dev: data/dev.tsv, tokenizer: {vocab: data/vocab.txt}}\n";
  EXPECT_EQ(Parse("  method: random\n  max_trials: 1\n  params:\n    train.lr: {choice: [0.01]}\n", inline_base)
                .trials[0]
                .spec.train.lr,
            0.01);
  const std::string error = ErrorOf("  method: random\n  max_trials: 1\n  params:\n    train.lr: {choice: [0.01]}\n",
                                    "base:\n  name: b\n  dta: {}\n");
  EXPECT_EQ(error.rfind("search.yaml:4:3: base: dta: unknown key; did you mean 'data'?", 0), 0u) << error;
}

TEST_F(SearchSpecTest, BadInputNamesTheFileLineAndKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"  method: random\n  max_trials: 2\n  params:\n    train.lrr: {uniform: [0.1, 0.2]}\n",
       "search.yaml:8:5: search.params.train.lrr: trial 1 (train.lrr="},
      {"  method: random\n  max_trials: 2\n  params:\n    train.lr: {uniform: [0.2, 0.1]}\n",
       "search.yaml:8:25: search.params.train.lr.uniform: expected low < high, got [0.2, 0.1]"},
      {"  method: random\n  max_trials: 2\n  params:\n    train.lr: {log_uniform: [-1, 0.1]}\n",
       "search.params.train.lr.log_uniform[0]: expected a number above 0"},
      {"  method: random\n  max_trials: 2\n  params:\n    train.lr: {normal: [0, 1]}\n",
       "search.params.train.lr: expected one of choice, int_uniform, log_uniform, uniform, got 'normal'"},
      {"  method: random\n  max_trials: 2\n  params:\n    train.epochs: {int_uniform: [1.5, 3]}\n",
       "search.params.train.epochs.int_uniform[0]: expected an integer, got '1.5'"},
      {"  method: random\n  max_trials: 2\n  params:\n    train.batch_size: {choice: [0]}\n",
       "search.params.train.batch_size: trial 1 (train.batch_size=0) is not a valid job: train.batch_size: expected"},
      {"  method: random\n  params:\n    train.lr: {choice: [1]}\n", "search.max_trials: required by method: random"},
      {"  method: grid\n  params:\n    train.lr: {uniform: [0.1, 0.2]}\n",
       "search.params.train.lr: method: grid takes choice or int_uniform values only"},
      {"  method: grid\n  params:\n    seed: {int_uniform: [1, 40]}\n    train.epochs: {int_uniform: [1, 40]}\n",
       "search.params: the grid has more than 1000 trials"},
      {"  method: asha\n  max_trials: 2\n  params:\n    train.lr: {choice: [1]}\n  asha: {min_epochs: 9}\n",
       "search.asha.min_epochs: expected fewer than max_epochs (9"},
      {"  method: random\n  max_trials: 2\n  params:\n    train.lr: {choice: [1]}\n  asha: {min_epochs: 1}\n",
       "search.asha: only used by method: asha"},
      {"  method: random\n  max_trials: 2\n  metric: acc\n  params:\n    train.lr: {choice: [1]}\n",
       "search.metric: expected one of eval_acc"},
      {"  method: random\n  max_trials: 2\n  params:\n    name: {choice: [x]}\n",
       "search.params.name: a search sets each trial's name itself"},
      {"  method: random\n  max_trials: 2\n  params:\n    train: {choice: [x]}\n    train.lr: {choice: [1]}\n",
       "search.params.train.lr: lies beneath search.params.train"},
      {"  method: random\n  max_trials: 2\n  params:\n    Train..lr: {choice: [1]}\n",
       "search.params.Train..lr: expected a job key in dotted form"},
      {"  method: random\n  max_trials: 2\n  params: {}\n", "search.params: expected a mapping"},
      {"  method: random\n  max_trials: 2\n  paramz: {}\n", "search.paramz: unknown key; did you mean 'params'?"},
  };
  for (const auto& [search, expected] : cases)
    EXPECT_NE(ErrorOf(search).find(expected), std::string::npos) << search << " gave: " << ErrorOf(search);
  EXPECT_NE(
      ErrorOf("  method: random\n  max_trials: 2\n  params:\n    train.lr: {choice: [1]}\n", "base: nowhere.yaml\n")
          .find("search.yaml:3:7: base: file not found"),
      std::string::npos);
  std::ofstream(dir_ / "bench.yaml")
      << "name: b\nkind: benchmark\ndata: {train: data/train.tsv, tokenizer: {vocab: data/vocab.txt}}\n";
  const std::string bench =
      ErrorOf("  method: random\n  max_trials: 2\n  params:\n    train.lr: {choice: [1]}\n", "base: bench.yaml\n");
  EXPECT_NE(bench.find("a search's base must be kind: finetune"), std::string::npos) << bench;
}

TEST_F(SearchSpecTest, HugeCountsAndDeepNestingAreRefusedCheaply) {
  std::string deep = "  method: random\n  max_trials: 2\n  params:\n    train.lr: {choice: ";
  for (int i = 0; i < 200; ++i) deep += "[";
  EXPECT_NE(ErrorOf(deep).find("search.yaml"), std::string::npos);
  EXPECT_NE(ErrorOf("  method: random\n  max_trials: 99999999999999999999\n  params:\n    train.lr: {choice: [1]}\n")
                .find("search.max_trials"),
            std::string::npos);
  EXPECT_NE(ErrorOf("  method: grid\n  params:\n    seed: {int_uniform: [1, 9000000000000000]}\n")
                .find("more than 1000 trials"),
            std::string::npos);
}

// A search file of 1 MB whose one choice value is 1 MB would expand into 200 MB of job
// files at 200 trials: priced by its values, before any trial is made. The same value
// at 30 trials fits.
TEST_F(SearchSpecTest, TrialsArePricedByTheirValuesBeforeAnyIsMade) {
  const std::string huge(size_t(1) << 20, 'v');
  const auto search = [&](int trials, const std::string& method) {
    return "  method: " + method + "\n  max_trials: " + std::to_string(trials) +
           "\n  params:\n    data.train: {choice: [\"" + huge + "\", b]}\n";
  };
  const auto started = std::chrono::steady_clock::now();
  const std::string random = ErrorOf(search(200, "random"));
  EXPECT_NE(random.find("200 trials of up to 1024 KiB each"), std::string::npos) << random.substr(0, 300);
  EXPECT_NE(random.find("more than 64 MiB of job files"), std::string::npos) << random.substr(0, 300);
  const std::string grid = ErrorOf(search(200, "grid") + "    seed: {int_uniform: [1, 100]}\n");
  EXPECT_NE(grid.find("200 trials of up to"), std::string::npos) << grid.substr(0, 300);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 10.0);
  const std::string fits = ErrorOf(search(30, "random"));
  EXPECT_EQ(fits.find("MiB of job files"), std::string::npos) << fits.substr(0, 300);
}

TEST_F(SearchSpecTest, ShippedExampleSearchParses) {
  // Its base's data may not be prepared here: a missing file is the one error allowed.
  const std::string path = SourcePath("configs/jobs/langid_search.yaml");
  try {
    const SearchSpec spec = ParseSearchSpec(ReadJobFile(path), path, fs::path(path).parent_path().string());
    EXPECT_EQ(spec.trials.size(), 12u);
    EXPECT_EQ(spec.asha.Rungs(), (std::vector<int>{1, 3}));
    EXPECT_EQ(spec.trials[0].spec.train.epochs, 9);
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("file not found"), std::string::npos) << e.what();
  }
}

TEST_F(SearchSpecTest, ABaseFileTravelsWithTheSubmission) {
  const std::string search =
      "name: s\nkind: search\nbase: base.yaml\nsearch:\n  method: random\n  max_trials: 1\n  params:\n"
      "    train.lr: {choice: [0.01]}\n";
  const SearchSpec read = ParseSearchSpec(search, "search.yaml", dir_.string());
  EXPECT_EQ(read.base_path, (dir_ / "base.yaml").string());
  EXPECT_EQ(read.base_text, kBase);
  // The coordinator's case: the text sent is used, and the file itself is never opened.
  fs::remove(dir_ / "base.yaml");
  const SearchBaseFile sent{read.base_path, std::string(kBase) + "seed: 99\n"};
  EXPECT_EQ(ParseSearchSpec(search, "search.yaml", dir_.string(), &sent).trials[0].spec.seed, 99u);
  const SearchBaseFile other{"/etc/passwd", "name: x\n"};
  try {
    ParseSearchSpec(search, "search.yaml", dir_.string(), &other);
    ADD_FAILURE() << "a base the submission does not carry was accepted";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("search.yaml:3:7: base: the submission does not carry"), std::string::npos)
        << e.what();
  }
}

TEST_F(SearchSpecTest, OnlyKindSearchIsASearchFile) {
  EXPECT_TRUE(IsSearchFile("name: s\nkind: search\n"));
  EXPECT_FALSE(IsSearchFile("name: s\nkind: finetune\n"));
  EXPECT_FALSE(IsSearchFile("[unclosed"));
  EXPECT_FALSE(IsSearchFile("- a\n- b\n"));
}

}  // namespace
}  // namespace trainyard
