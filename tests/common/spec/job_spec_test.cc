#include "common/spec/job_spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/source_path.h"

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

TEST_F(JobSpecTest, ASearchFileSaysToSubmitItWithJobctl) {
  // Its own keys (base, search) are not what the error is about.
  std::string error = ErrorOf("name: s\nkind: search\nbase: base.yaml\nsearch:\n  method: grid\n");
  EXPECT_EQ(error,
            "job.yaml:2:7: kind: a search runs on a coordinator, which runs its trials as jobs: submit it with "
            "`jobctl submit job.yaml` (docs/search.md)");
}

TEST_F(JobSpecTest, WrongTypeSaysWhatWasExpected) {
  std::string error = ErrorOf(Valid("  batch_size: large\n"));
  EXPECT_EQ(error, "job.yaml:8:15: train.batch_size: expected an integer, got 'large'");
}

TEST_F(JobSpecTest, NegativeEpochsAreOutOfRange) {
  std::string yaml = Valid();
  yaml.replace(yaml.find("epochs: 2"), 9, "epochs: -1");
  EXPECT_EQ(ErrorOf(yaml), "job.yaml:7:11: train.epochs: expected an integer in [1, 100000], got -1");
}

// Before: range-checked as int64 and then cut to int, so 2^32 + 1 epochs became 1 and
// 2^32 checkpoints to keep became 0 (every checkpoint deleted).
TEST_F(JobSpecTest, IntegersAreCheckedAgainstTheFieldsRealRange) {
  EXPECT_EQ(ErrorOf(Valid("  batch_size: 4294967297\n")),
            "job.yaml:8:15: train.batch_size: expected an integer in [1, 65536], got 4294967297");
  std::string yaml = Valid();
  yaml.replace(yaml.find("epochs: 2"), 9, "epochs: 4294967297");
  EXPECT_EQ(ErrorOf(yaml), "job.yaml:7:11: train.epochs: expected an integer in [1, 100000], got 4294967297");
  EXPECT_EQ(ErrorOf(Valid() + "checkpoint:\n  keep: 4294967296\n"),
            "job.yaml:9:9: checkpoint.keep: expected an integer in [1, 10000], got 4294967296");
  EXPECT_EQ(ErrorOf(Valid() + "resources:\n  priority: 2147483648\n"),
            "job.yaml:9:13: resources.priority: expected an integer in [-1000000, 1000000], got 2147483648");
  EXPECT_EQ(ErrorOf(Valid("  max_steps: 99999999999999999999\n")),
            "job.yaml:8:14: train.max_steps: expected an integer, got '99999999999999999999'");
  EXPECT_EQ(Parse(Valid("  batch_size: 65536\n")).train.batch_size, 65536);
}

TEST_F(JobSpecTest, BenchmarkListItemsAreBounded) {
  std::string error = ErrorOf("kind: benchmark\n" + Valid() + "benchmark:\n  batch_sizes: [1, 4294967297]\n");
  EXPECT_NE(error.find("benchmark.batch_sizes[1]: expected an integer in [1, 65536], got 4294967297"),
            std::string::npos)
      << error;
}

TEST_F(JobSpecTest, FloatsMustBeFinite) {
  EXPECT_EQ(ErrorOf(Valid("  lr: .nan\n")), "job.yaml:8:7: train.lr: expected a finite number, got '.nan'");
  EXPECT_EQ(ErrorOf(Valid("  max_grad_norm: .inf\n")),
            "job.yaml:8:18: train.max_grad_norm: expected a finite number, got '.inf'");
  EXPECT_EQ(ErrorOf(Valid() + "model:\n  dropout: .NaN\n"),
            "job.yaml:9:12: model.dropout: expected a finite number, got '.NaN'");
}

TEST_F(JobSpecTest, NameIsOneSafePathComponent) {
  const std::string expected =
      "name: expected one path component of letters, digits, '.', '_' or '-' (at most 100 characters, not '.' or "
      "'..')";
  for (const std::string& bad :
       std::vector<std::string>{"..", ".", "a/b", "\"a\\nb\"", "\"a b\"", "\"\"", "'..'", std::string(101, 'x')}) {
    std::string yaml = Valid();
    yaml.replace(0, 7, "name: " + bad);
    EXPECT_EQ(ErrorOf(yaml), "job.yaml:1:7: " + expected) << bad;
  }
  std::string yaml = Valid();
  yaml.replace(0, 7, "name: Lang-id_2.tiny");
  EXPECT_EQ(Parse(yaml).name, "Lang-id_2.tiny");
}

// Inputs that made yaml-cpp throw past every handler (as<std::string> of a complex
// key) or that look odd but must be handled: each is a located SpecError.
TEST_F(JobSpecTest, UnusualYamlIsALocatedSpecError) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"complex key", "? [a, b]\n: 1\n" + Valid()},
      {"null key", "?\n: 1\n" + Valid()},
      {"complex key in a section", Valid("  ? {a: 1}\n  : 2\n")},
      {"alias of a map as a scalar", "name: &n {a: 1}\n" + Valid().substr(8) + "  batch_size: *n\n"},
      {"undefined alias", Valid("  batch_size: *nowhere\n")},
      {"binary as an integer", Valid("  batch_size: !!binary AAAA\n")},
      {"tagged map as a section", Valid() + "model: !!map {preset: [tiny]}\n"},
      {"merge key", Valid("  <<: {lr: 1}\n")},
      {"deep flow nesting", "name: t\nx: " + std::string(5000, '[') + std::string(5000, ']') + "\n"},
      {"deep map nesting", "name: t\nx: " + std::string(3000, '{') + "\n"},
      {"tab indentation", "name: t\ndata:\n\ttrain: x\n"},
      {"sequence as a key list", Valid() + "train: [1, 2]\n"},
  };
  for (const auto& [what, yaml] : cases) {
    std::string error;
    try {
      Parse(yaml);
      ADD_FAILURE() << what << ": accepted";
    } catch (const SpecError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": escaped as " << typeid(e).name() << ": " << e.what();
    }
    EXPECT_TRUE(error.rfind("job.yaml:", 0) == 0 && std::isdigit(static_cast<unsigned char>(error[9])))
        << what << ": " << error;
  }
}

TEST_F(JobSpecTest, DeepNestingSaysSo) {
  std::string error = ErrorOf("name: t\nx: " + std::string(5000, '[') + std::string(5000, ']') + "\n");
  EXPECT_NE(error.find("malformed YAML: nested deeper than"), std::string::npos) << error;
}

// A FIFO as a dataset made every rank block in open(); a folder or a device is no
// better. Paths the job reads must be regular files (symlinks to one are fine).
TEST_F(JobSpecTest, DataPathsMustBeRegularFiles) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  fs::create_symlink(dir_ / "data/train.tsv", dir_ / "link.tsv");
  auto with_train = [&](const std::string& path) {
    std::string yaml = Valid();
    yaml.replace(yaml.find("data/train.tsv"), 14, path);
    return yaml;
  };
  EXPECT_EQ(ErrorOf(with_train("fifo")),
            "job.yaml:3:10: data.train: a special file (FIFO, device or socket), not a "
            "regular file: " +
                (dir_ / "fifo").string());
  EXPECT_EQ(ErrorOf(with_train("/dev/zero")),
            "job.yaml:3:10: data.train: a special file (FIFO, device or socket), not a regular file: /dev/zero");
  EXPECT_EQ(ErrorOf(with_train("data")),
            "job.yaml:3:10: data.train: a folder, not a regular file: " + (dir_ / "data").string());
  EXPECT_EQ(Parse(with_train("link.tsv")).data.train, (dir_ / "link.tsv").string());
  std::string error = ErrorOf(Valid() + "checkpoint:\n  resume: /dev/null\n");
  EXPECT_NE(error.find("checkpoint.resume: a special file"), std::string::npos) << error;
  error = ErrorOf(Valid() + "model:\n  init: data/train.tsv\n");
  EXPECT_NE(error.find("model.init: not a folder"), std::string::npos) << error;
  fs::create_directories(dir_ / "hf/config.json");
  std::ofstream(dir_ / "hf/model.safetensors") << "x";
  error = ErrorOf(Valid() + "model:\n  init: hf\n");
  EXPECT_NE(error.find("model.init: expected a folder holding model.safetensors and config.json: a folder, not a "
                       "regular file"),
            std::string::npos)
      << error;
}

TEST_F(JobSpecTest, JobFileMustBeARegularFile) {
  ASSERT_EQ(::mkfifo((dir_ / "job.fifo").c_str(), 0600), 0);
  try {
    LoadJobSpec((dir_ / "job.fifo").string());
    ADD_FAILURE() << "a FIFO was read as a job file";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("<file>: a special file"), std::string::npos) << e.what();
  }
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

TEST_F(JobSpecTest, LoraSectionIsParsedWithPeftDefaults) {
  JobSpec spec = Parse(Valid() + "model:\n  lora:\n    r: 4\n    target_modules: [query, value]\n    merge: true\n");
  EXPECT_TRUE(spec.model.lora.enabled);
  EXPECT_EQ(spec.model.lora.r, 4);
  EXPECT_DOUBLE_EQ(spec.model.lora.alpha, 8.0);
  EXPECT_EQ(spec.model.lora.target_modules, (std::vector<std::string>{"query", "value"}));
  EXPECT_TRUE(spec.model.lora.merge);
  EXPECT_TRUE(Parse(Valid() + "model:\n  lora:\n").model.lora.enabled);
  // PEFT's string form: a regex the whole module name must match.
  const JobSpec regex = Parse(Valid() + "model:\n  lora:\n    target_modules: '.*\\.(query|value)'\n");
  EXPECT_EQ(regex.model.lora.target_regex, ".*\\.(query|value)");
  EXPECT_TRUE(regex.model.lora.target_modules.empty());
  EXPECT_NE(
      ErrorOf(Valid() + "model:\n  lora:\n    target_modules: 'attn.(q'\n")
          .find(
              "model.lora.target_modules: expected a list of module names or a regex string: 'attn.(q' is not a regex"),
      std::string::npos);
  // 100,000 nested parentheses (200 KB) once crashed the coordinator in std::regex's
  // recursive compiler; now they are refused, as is a pattern that only backtracking
  // engines take.
  const std::string deep = std::string(100000, '(') + "a" + std::string(100000, ')');
  std::string error = ErrorOf(Valid() + "model:\n  lora:\n    target_modules: '" + deep + "'\n");
  EXPECT_NE(error.find("model.lora.target_modules: expected a list of module names or a regex string: '((((("),
            std::string::npos)
      << error.substr(0, 300);
  EXPECT_NE(error.find("longer than 4096 bytes"), std::string::npos) << error.substr(0, 300);
  EXPECT_LT(error.size(), 400u);
  error = ErrorOf(Valid() + "model:\n  lora:\n    target_modules: '(?=query).*'\n");
  EXPECT_NE(error.find("without lookaround"), std::string::npos) << error;
  EXPECT_TRUE(Parse(Valid() + "model:\n  lora:\n    target_modules: '(.*)*(.*)*(.*)*z'\n").model.lora.enabled);
  EXPECT_FALSE(Parse(Valid()).model.lora.enabled);
  EXPECT_NE(ErrorOf(Valid() + "model:\n  lora: {rank: 4}\n").find("model.lora"), std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "model:\n  lora: {r: 0}\n").find("model.lora.r: expected an integer in [1, 65536]"),
            std::string::npos);
}

TEST_F(JobSpecTest, CausalLmTrainsOnPlainText) {
  std::string error = ErrorOf("task: causal_lm\n" + Valid());
  EXPECT_NE(error.find("data.format: task: causal_lm trains on plain text"), std::string::npos) << error;
  JobSpec spec = Parse(
      "name: lm\ntask: causal_lm\ndata:\n  train: data/train.tsv\n  format: text\n"
      "  tokenizer: {vocab: data/vocab.txt}\nmodel: {family: gpt2}\n");
  EXPECT_EQ(spec.task, TaskKind::kCausalLm);
  EXPECT_EQ(spec.data.format, DataFormat::kText);
  EXPECT_EQ(spec.model.family, "gpt2");
  EXPECT_NE(ErrorOf(Valid() + "model: {family: xlnet}\n").find("model.family: expected one of"), std::string::npos);
}

TEST_F(JobSpecTest, UnpadIsAutoUnlessSetToAlwaysOrNever) {
  EXPECT_EQ(Parse(Valid()).model.unpad, "auto");
  EXPECT_EQ(Parse(Valid() + "model: {unpad: never}\n").model.unpad, "never");
  const std::string error = ErrorOf(Valid() + "model: {unpad: sometimes}\n");
  EXPECT_NE(error.find("model.unpad: expected one of always, auto, never, got 'sometimes'"), std::string::npos)
      << error;
}

TEST_F(JobSpecTest, WeightCastsAreOnceByDefault) {
  EXPECT_EQ(Parse(Valid()).runtime.weight_casts, "once");
  EXPECT_EQ(Parse(Valid() + "runtime: {weight_casts: each_pass}\n").runtime.weight_casts, "each_pass");
  const std::string error = ErrorOf(Valid() + "runtime: {weight_casts: twice}\n");
  EXPECT_NE(error.find("job.yaml:8:"), std::string::npos) << error;
  EXPECT_NE(error.find("runtime.weight_casts: expected one of each_pass, once, got 'twice'"), std::string::npos)
      << error;
}

TEST_F(JobSpecTest, FusedKernelsAreAutoByDefaultAndTrueRefusesTheCpu) {
  EXPECT_EQ(Parse(Valid()).model.fused_kernels, "auto");
  EXPECT_EQ(Parse(Valid() + "model: {fused_kernels: true}\n").model.fused_kernels, "true");
  EXPECT_EQ(Parse(Valid() + "model: {fused_kernels: false}\n").model.fused_kernels, "false");
  EXPECT_EQ(Parse(Valid() + "model: {fused_kernels: true}\nruntime: {device: cuda}\n").model.fused_kernels, "true");
  EXPECT_EQ(Parse(Valid() + "model: {fused_kernels: auto}\nruntime: {device: cpu}\n").model.fused_kernels, "auto");
  std::string error = ErrorOf(Valid() + "model: {fused_kernels: sometimes}\n");
  EXPECT_NE(error.find("job.yaml:8:"), std::string::npos) << error;
  EXPECT_NE(error.find("model.fused_kernels: expected one of auto, false, true, got 'sometimes'"), std::string::npos)
      << error;
  error = ErrorOf(Valid() + "model: {fused_kernels: true}\nruntime: {device: cpu}\n");
  EXPECT_NE(error.find("job.yaml:8:"), std::string::npos) << error;
  EXPECT_NE(error.find("model.fused_kernels: the fused kernels are CUDA kernels"), std::string::npos) << error;
}

TEST_F(JobSpecTest, Bf16WeightsNeedBf16PrecisionAndNoLora) {
  EXPECT_FALSE(Parse(Valid()).train.bf16_weights);
  EXPECT_TRUE(Parse(Valid("  precision: bf16\n  bf16_weights: true\n")).train.bf16_weights);
  std::string error = ErrorOf(Valid("  bf16_weights: true\n"));
  EXPECT_NE(error.find("job.yaml:8:"), std::string::npos) << error;
  EXPECT_NE(error.find("train.bf16_weights: bf16 weights need train.precision: bf16, not fp32"), std::string::npos)
      << error;
  error = ErrorOf(Valid("  precision: fp16\n  bf16_weights: true\n"));
  EXPECT_NE(error.find("not fp16"), std::string::npos) << error;
  error = ErrorOf("model: {lora: {r: 4}}\n" + Valid("  precision: bf16\n  bf16_weights: true\n"));
  EXPECT_NE(error.find("train.bf16_weights: not with model.lora"), std::string::npos) << error;
  error = ErrorOf(Valid("  precision: bf16\n  bf16_weights: sometimes\n"));
  EXPECT_NE(error.find("train.bf16_weights"), std::string::npos) << error;
}

TEST_F(JobSpecTest, CudaGraphIsOffUnlessAskedAndTakesUnpaddingAlways) {
  EXPECT_EQ(Parse(Valid()).train.cuda_graph, GraphMode::kOff);
  EXPECT_EQ(Parse(Valid("  cuda_graph: auto\n")).train.cuda_graph, GraphMode::kAuto);
  EXPECT_EQ(Parse(Valid("  cuda_graph: true\n")).train.cuda_graph, GraphMode::kOn);
  std::string error = ErrorOf(Valid("  cuda_graph: sometimes\n"));
  EXPECT_NE(error.find("job.yaml:8:"), std::string::npos) << error;
  EXPECT_NE(error.find("train.cuda_graph: expected one of auto, false, true, got 'sometimes'"), std::string::npos)
      << error;
  // The host packs the batches (worker/models/token_index.h), so graphs take them.
  EXPECT_EQ(Parse("model: {unpad: always}\n" + Valid("  cuda_graph: true\n")).model.unpad, "always");
  EXPECT_EQ(Parse(Valid()).data.pad_buckets, 0);
  std::string padded = Valid();
  padded.replace(padded.find("  tokenizer:"), 0, "  pad_buckets: 65\n");
  error = ErrorOf(padded);
  EXPECT_NE(error.find("data.pad_buckets"), std::string::npos) << error;
}

TEST_F(JobSpecTest, GenerateJobImpliesCausalLmAndNeedsPrompts) {
  const std::string tokenizer = "data:\n  tokenizer: {vocab: data/vocab.txt}\n";
  JobSpec spec = Parse("name: g\nkind: generate\n" + tokenizer +
                       "generate: {prompts: data/train.tsv, max_new_tokens: 5, strategy: sample, stop: [x]}\n");
  EXPECT_EQ(spec.task, TaskKind::kCausalLm);
  EXPECT_EQ(spec.generate.max_new_tokens, 5);
  EXPECT_TRUE(spec.generate.sample);
  EXPECT_EQ(spec.generate.stop, std::vector<std::string>{"x"});
  EXPECT_NE(ErrorOf("name: g\nkind: generate\n" + tokenizer).find("generate.prompts: required"), std::string::npos);
  EXPECT_NE(
      ErrorOf("name: g\nkind: generate\ntask: classification\n" + tokenizer + "generate: {prompts: data/train.tsv}\n")
          .find("task: kind: generate needs task: causal_lm"),
      std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "generate: {prompts: data/train.tsv}\n").find("only used by kind: generate"),
            std::string::npos);
}

TEST_F(JobSpecTest, GenerateBenchmarkNeedsACausalLmAndRunsEagerOrCudaGraph) {
  const std::string lm = "task: causal_lm\nkind: benchmark\nbenchmark: {mode: generate";
  JobSpec spec = Parse(Valid() + lm + ", new_tokens: 64, modes: [eager, cuda_graph]}\n");
  EXPECT_EQ(spec.benchmark.run, BenchmarkRun::kGenerate);
  EXPECT_EQ(spec.benchmark.new_tokens, 64);
  EXPECT_EQ(Parse(Valid() + lm + "}\n").benchmark.new_tokens, 32);
  EXPECT_EQ(Parse(Valid() + "kind: benchmark\nbenchmark: {mode: train_step}\n").benchmark.run,
            BenchmarkRun::kTrainStep);
  EXPECT_EQ(Parse(Valid() + "kind: benchmark\n").benchmark.run, BenchmarkRun::kSweep);
  EXPECT_NE(ErrorOf(Valid() + "kind: benchmark\nbenchmark: {mode: generate}\n")
                .find("benchmark.mode: generate needs task: causal_lm"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + lm + ", modes: [int8]}\n").find("mode: generate runs eager or cuda_graph, not int8"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + lm + ", new_tokens: 1}\n").find("benchmark.new_tokens"), std::string::npos);
}

TEST_F(JobSpecTest, ExportModesNeedTheirPackage) {
  std::ofstream(dir_ / "data/model.pt2") << "x";
  const std::string infer = "kind: inference\ninference: {input: data/train.tsv";
  JobSpec spec = Parse(Valid() + infer + ", mode: aoti, aoti: data/model.pt2}\n");
  EXPECT_EQ(spec.inference.mode, ForwardMode::kAoti);
  EXPECT_EQ(spec.inference.aoti, (dir_ / "data/model.pt2").string());
  EXPECT_EQ(Parse(Valid() + infer + ", mode: int8}\n").inference.mode, ForwardMode::kInt8);
  EXPECT_EQ(Parse(Valid() + infer + "}\n").inference.mode, ForwardMode::kEager);
  EXPECT_NE(ErrorOf(Valid() + infer + ", mode: aoti}\n").find("inference.aoti: required with mode: aoti"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + infer + ", mode: onnx}\n").find("inference.mode"), std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + infer + ", mode: aoti, aoti: data/missing.pt2}\n").find("inference.aoti"),
            std::string::npos);
  const std::string bench = "kind: benchmark\nbenchmark: {modes: [eager, int8, aoti]";
  spec = Parse(Valid() + bench + ", aoti: data/model.pt2}\n");
  EXPECT_EQ(spec.benchmark.modes,
            (std::vector<ForwardMode>{ForwardMode::kEager, ForwardMode::kInt8, ForwardMode::kAoti}));
  EXPECT_NE(ErrorOf(Valid() + bench + "}\n").find("benchmark.aoti: required by the aoti mode"), std::string::npos);
}

TEST_F(JobSpecTest, ProfileStepsAreBounded) {
  JobSpec spec = Parse(Valid() + "log: {profile_steps: 20, profile_from_step: 5}\n");
  EXPECT_EQ(spec.log.profile_steps, 20);
  EXPECT_EQ(spec.log.profile_from_step, 5);
  EXPECT_EQ(Parse(Valid()).log.profile_steps, 0);
  EXPECT_NE(ErrorOf(Valid() + "log: {profile_steps: -1}\n").find("log.profile_steps"), std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "log: {profile_from_step: 0}\n").find("log.profile_from_step"), std::string::npos);
}

TEST_F(JobSpecTest, AccumulationAndScheduleHaveHfTrainersDefaults) {
  const JobSpec plain = Parse(Valid());
  EXPECT_EQ(plain.train.gradient_accumulation_steps, 1);
  EXPECT_EQ(plain.train.lr_schedule, ScheduleKind::kLinear);
  const JobSpec set = Parse(Valid("  gradient_accumulation_steps: 4\n  lr_schedule: cosine\n"));
  EXPECT_EQ(set.train.gradient_accumulation_steps, 4);
  EXPECT_EQ(set.train.lr_schedule, ScheduleKind::kCosine);
  EXPECT_EQ(Parse(Valid("  lr_schedule: constant\n")).train.lr_schedule, ScheduleKind::kConstant);
  EXPECT_NE(ErrorOf(Valid("  gradient_accumulation_steps: 0\n")).find("train.gradient_accumulation_steps"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Valid("  lr_schedule: polynomial\n")).find("train.lr_schedule"), std::string::npos);
}

TEST_F(JobSpecTest, StepPauseIsOffByDefaultAndAtMostTenSeconds) {
  EXPECT_EQ(Parse(Valid()).debug.step_pause_ms, 0);
  EXPECT_EQ(Parse(Valid() + "debug: {step_pause_ms: 80}\n").debug.step_pause_ms, 80);
  EXPECT_EQ(ErrorOf(Valid() + "debug: {step_pause_ms: 10001}\n"),
            "job.yaml:8:24: debug.step_pause_ms: expected an integer in [0, 10000], got 10001");
  EXPECT_NE(ErrorOf(Valid() + "debug: {step_pause_ms: -1}\n").find("debug.step_pause_ms"), std::string::npos);
}

TEST_F(JobSpecTest, EvaluationDefaultsToEpochEndsAndEveryMetricOfTheTask) {
  const JobSpec spec = Parse(Valid());
  EXPECT_EQ(spec.eval.every_steps, 0);
  EXPECT_TRUE(spec.eval.metrics.empty());
  EXPECT_EQ(spec.eval.batch_size, 64);  // twice train.batch_size's 32
  EXPECT_TRUE(spec.checkpoint.best_metric.empty());
  EXPECT_FALSE(spec.train.early_stopping.enabled);
  EXPECT_EQ(EvalMetricNames(TaskKind::kClassification),
            (std::vector<std::string>{"accuracy", "f1", "precision", "recall"}));
}

TEST_F(JobSpecTest, BestMetricInfersItsDirectionAndEarlyStoppingJudgesIt) {
  std::ofstream(dir_ / "data/dev.tsv") << "label\ttext\na\thello\n";
  const std::string with_dev =
      "name: t\ndata: {train: data/train.tsv, dev: data/dev.tsv, tokenizer: {vocab: "
      "data/vocab.txt}}\n";
  JobSpec spec = Parse(with_dev +
                       "train: {early_stopping: {patience: 3, threshold: 0.01}}\n"
                       "eval: {every_steps: 50, metrics: [f1, accuracy], test: data/dev.tsv, batch_size: 8}\n"
                       "checkpoint: {best_metric: eval_f1}\n");
  EXPECT_EQ(spec.eval.every_steps, 50);
  EXPECT_EQ(spec.eval.metrics, (std::vector<std::string>{"f1", "accuracy"}));
  EXPECT_EQ(spec.eval.test, (dir_ / "data/dev.tsv").string());
  EXPECT_EQ(spec.eval.batch_size, 8);
  EXPECT_TRUE(spec.checkpoint.greater_is_better);
  EXPECT_TRUE(spec.train.early_stopping.enabled);
  EXPECT_EQ(spec.train.early_stopping.patience, 3);
  EXPECT_DOUBLE_EQ(spec.train.early_stopping.threshold, 0.01);
  EXPECT_FALSE(Parse(with_dev + "checkpoint: {best_metric: eval_loss}\n").checkpoint.greater_is_better);
  EXPECT_TRUE(
      Parse(with_dev + "checkpoint: {best_metric: eval_loss, greater_is_better: true}\n").checkpoint.greater_is_better);
  EXPECT_EQ(ErrorOf(with_dev + "checkpoint: {best_metric: f1}\n"),
            "job.yaml:3:27: checkpoint.best_metric: expected one of eval_loss, eval_accuracy, eval_f1, "
            "eval_precision, eval_recall, got 'f1'");
  EXPECT_EQ(ErrorOf(with_dev + "eval: {metrics: [accuracy]}\ncheckpoint: {best_metric: eval_f1}\n"),
            "job.yaml:4:27: checkpoint.best_metric: 'eval_f1' is not among eval.metrics; add f1 to them");
  EXPECT_EQ(ErrorOf(with_dev + "train: {early_stopping: {patience: 2}}\n"),
            "job.yaml:3:25: train.early_stopping: needs checkpoint.best_metric: the metric whose evaluations it "
            "judges (e.g. eval_loss)");
  EXPECT_EQ(ErrorOf(with_dev + "eval: {metrics: [perplexity]}\n"),
            "job.yaml:3:18: eval.metrics[0]: expected one of accuracy, f1, precision, recall for task: "
            "classification, got 'perplexity' (the loss is always reported)");
}

TEST_F(JobSpecTest, EvaluationsNeedADevSetAndAFinetuneJob) {
  EXPECT_EQ(ErrorOf(Valid() + "eval: {every_steps: 10}\n"),
            "job.yaml:8:21: eval.every_steps: needs data.dev: the split it evaluates");
  EXPECT_EQ(ErrorOf(Valid() + "checkpoint: {best_metric: eval_loss}\n"),
            "job.yaml:8:27: checkpoint.best_metric: needs data.dev to judge by");
  EXPECT_NE(ErrorOf(Valid() + "eval: {test: data/missing.tsv}\n").find("eval.test"), std::string::npos);
  EXPECT_EQ(ErrorOf(Valid() + "kind: benchmark\neval: {every_steps: 10}\n"),
            "job.yaml:9:7: eval: only used by kind: finetune");
}

TEST_F(JobSpecTest, SetOverridesKeysInOrderAndItsErrorsNameTheSet) {
  SpecOverrides o;
  o.AddAssignment("train.lr=3e-5");
  o.AddAssignment("eval.metrics=[f1, accuracy]");  // a section the file lacks
  o.AddAssignment("train.lr=4e-5");                // the later one wins
  JobSpec spec = ParseJobSpec(Valid(), "job.yaml", dir_.string(), o);
  EXPECT_DOUBLE_EQ(spec.train.lr, 4e-5);
  EXPECT_EQ(spec.train.epochs, 2);  // the file's other keys stay
  EXPECT_EQ(spec.eval.metrics, (std::vector<std::string>{"f1", "accuracy"}));
  EXPECT_EQ(spec.Where("train.lr"), "--set train.lr=4e-5: train.lr");
  EXPECT_NE(spec.effective_yaml.find("lr: 4e-5"), std::string::npos) << spec.effective_yaml;
  EXPECT_NE(spec.effective_yaml.find("epochs: 2"), std::string::npos) << spec.effective_yaml;

  auto error_with = [&](const std::string& assignment) {
    try {
      SpecOverrides one;
      one.AddAssignment(assignment);
      ParseJobSpec(Valid(), "job.yaml", dir_.string(), one);
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_with("train.lr=abc"), "--set train.lr=abc: train.lr: expected a number, got 'abc'");
  EXPECT_EQ(error_with("train.lrr=1"), "--set train.lrr=1: train.lrr: unknown key; did you mean 'lr'?");
  EXPECT_EQ(error_with("train.epochs.x=1"),
            "--set train.epochs.x=1: train.epochs: not a mapping in the job file, so it has no key 'x'");
  EXPECT_EQ(error_with("train.lr"), "--set train.lr: expected KEY.PATH=VALUE, e.g. train.lr=3e-5");
  EXPECT_EQ(error_with("train..lr=1"), "--set train..lr=1: expected KEY.PATH=VALUE, e.g. train.lr=3e-5");
  EXPECT_EQ(error_with("train.lr=[1"),
            "--set train.lr=[1: train.lr: the value: malformed YAML: end of sequence flow "
            "not found");
  EXPECT_EQ(error_with("train.lr=" + std::string(20, '[') + std::string(20, ']')),
            "--set train.lr=" + std::string(20, '[') + std::string(20, ']') +
                ": train.lr: the value: malformed YAML: nested deeper than 8 levels");
  EXPECT_EQ(error_with("data.dev=missing.tsv").rfind("--set data.dev=missing.tsv: data.dev: ", 0), 0u);
  EXPECT_EQ(error_with("eval.every_steps=5"),
            "--set eval.every_steps=5: eval.every_steps: needs data.dev: the "
            "split it evaluates");
}

TEST_F(JobSpecTest, EnvironmentVariablesExpandInTheFilesValuesOnlyWhenAsked) {
  ::setenv("TY_SPEC_TEST_EPOCHS", "4", 1);
  ::unsetenv("TY_SPEC_TEST_UNSET");
  SpecOverrides expand;
  expand.expand_environment = true;
  const std::string text =
      "name: t-${TY_SPEC_TEST_EPOCHS}\n"
      "data:\n"
      "  train: ${TY_SPEC_TEST_UNSET:-data/train.tsv}\n"
      "  text_field: $${kept}\n"
      "  tokenizer: {vocab: data/vocab.txt}\n"
      "train: {epochs: '${TY_SPEC_TEST_EPOCHS}'}\n";
  const JobSpec spec = ParseJobSpec(text, "job.yaml", dir_.string(), expand);
  EXPECT_EQ(spec.name, "t-4");
  EXPECT_EQ(spec.train.epochs, 4);
  EXPECT_EQ(spec.data.train, (dir_ / "data/train.tsv").string());
  EXPECT_EQ(spec.data.text_field, "${kept}");
  EXPECT_NE(spec.effective_yaml.find("name: t-4"), std::string::npos) << spec.effective_yaml;
  auto error_of = [&](const std::string& yaml) {
    try {
      ParseJobSpec(yaml, "job.yaml", dir_.string(), expand);
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of(Valid("  lr: ${TY_SPEC_TEST_UNSET}\n")),
            "job.yaml:8:7: train.lr: ${TY_SPEC_TEST_UNSET} is not set in the environment "
            "(${TY_SPEC_TEST_UNSET:-default} gives a default)");
  EXPECT_EQ(error_of(Valid("  lr: ${1X}\n")),
            "job.yaml:8:7: train.lr: '${1X}' is not a variable reference: expected ${NAME} or ${NAME:-default}");
  EXPECT_EQ(error_of(Valid("  lr: ${X\n")), "job.yaml:8:7: train.lr: an unterminated ${ (write $${ for a literal ${)");
  // Without expansion (a pool's parse of a submitted job) the text stays as written.
  EXPECT_EQ(ErrorOf(Valid("  lr: ${TY_SPEC_TEST_EPOCHS}\n")),
            "job.yaml:8:7: train.lr: expected a number, got '${TY_SPEC_TEST_EPOCHS}'");
}

TEST_F(JobSpecTest, ExpansionVisitsEachNodeOnceWhateverTheAliases) {
  SpecOverrides expand;
  expand.expand_environment = true;
  // 2^40 paths through 80 aliases, and a map that holds itself: both end at once.
  std::string laughs = Valid() + "log: {runs_dir: &l0 '${TY_SPEC_TEST_UNSET:-runs}'}\n";
  for (int i = 1; i <= 40; ++i)
    laughs += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [*l" + std::to_string(i - 1) + ", *l" +
              std::to_string(i - 1) + "]\n";
  try {
    ParseJobSpec(laughs, "job.yaml", dir_.string(), expand);
    ADD_FAILURE() << "parsed";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("l1: unknown key"), std::string::npos) << e.what();
  }
  const std::string itself = "name: t\ndata: &d\n  train: data/train.tsv\n  dev: *d\n";
  try {
    ParseJobSpec(itself, "job.yaml", dir_.string(), expand);
    ADD_FAILURE() << "parsed";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("data.dev: expected a string"), std::string::npos) << e.what();
  }
}

// An HF folder with the files model.init needs and `extra` beside them.
void HfFolder(const fs::path& folder, const std::vector<std::pair<std::string, std::string>>& extra) {
  fs::create_directories(folder);
  std::ofstream(folder / "model.safetensors") << "weights";
  std::ofstream(folder / "config.json") << "{}";
  for (const auto& [name, text] : extra) std::ofstream(folder / name) << text;
}

TEST_F(JobSpecTest, AModelInitFolderBringsItsOwnTokenizer) {
  const std::string no_tokenizer = "name: t\ndata: {train: data/train.tsv}\nmodel: {init: hf}\n";
  HfFolder(dir_ / "hf", {{"vocab.txt", "[PAD]\n"}, {"tokenizer_config.json", R"({"do_lower_case": false})"}});
  JobSpec spec = Parse(no_tokenizer);
  EXPECT_EQ(spec.data.tokenizer.kind, TokenizerKind::kWordPiece);
  EXPECT_EQ(spec.data.tokenizer.vocab, (dir_ / "hf" / "vocab.txt").string());
  EXPECT_FALSE(spec.data.tokenizer.lowercase);
  fs::remove_all(dir_ / "hf");
  HfFolder(dir_ / "hf", {{"vocab.json", "{}"}, {"merges.txt", "#version\n"}, {"tokenizer_config.json", "[1, 2"}});
  spec = Parse(no_tokenizer);
  EXPECT_EQ(spec.data.tokenizer.kind, TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(spec.data.tokenizer.merges, (dir_ / "hf" / "merges.txt").string());
  EXPECT_FALSE(spec.data.tokenizer.add_prefix_space);  // an unreadable tokenizer_config.json: the defaults
  // A tokenizer the job names wins.
  EXPECT_EQ(Parse(no_tokenizer.substr(0, no_tokenizer.find('}')) + ", tokenizer: {vocab: data/vocab.txt}}\n" +
                  "model: {init: hf}\n")
                .data.tokenizer.vocab,
            (dir_ / "data/vocab.txt").string());
  fs::remove_all(dir_ / "hf");
  // Only a tokenizer.json: read now, its settings taken (common/tokenizer_json.h).
  HfFolder(dir_ / "hf", {{"tokenizer.json", R"({"normalizer": null,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})"}});
  spec = Parse(no_tokenizer);
  EXPECT_EQ(spec.data.tokenizer.kind, TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(spec.data.tokenizer.tokenizer_json, (dir_ / "hf" / "tokenizer.json").string());
  EXPECT_TRUE(spec.data.tokenizer.vocab.empty());
  EXPECT_TRUE(spec.data.tokenizer.add_prefix_space);
  // A generate job with model.init needs no data section at all.
  const std::string generate =
      "name: g\nkind: generate\ntask: causal_lm\nmodel: {init: hf}\n"
      "generate: {prompts: data/train.tsv}\n";
  EXPECT_EQ(Parse(generate).data.tokenizer.kind, TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(ErrorOf("name: g\nkind: generate\ntask: causal_lm\nmodel: {preset: tiny}\n"
                    "generate: {prompts: data/train.tsv}\n"),
            "job.yaml:1:1: data: required: a data mapping");
  fs::remove_all(dir_ / "hf");
  HfFolder(dir_ / "hf", {{"tokenizer.json", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})"}});
  EXPECT_EQ(ErrorOf(no_tokenizer), "job.yaml:3:15: model.init: its tokenizer (data.tokenizer is absent): " +
                                       (dir_ / "hf" / "tokenizer.json").string() +
                                       ": model.type: \"Unigram\" is not read here; only WordPiece and byte-level "
                                       "BPE are");
  fs::remove_all(dir_ / "hf");
  HfFolder(dir_ / "hf", {});
  EXPECT_EQ(ErrorOf(no_tokenizer),
            "job.yaml:3:15: data.tokenizer: absent, and the model.init folder holds no vocab.txt, vocab.json with "
            "merges.txt, or tokenizer.json: give data.tokenizer");
  EXPECT_EQ(ErrorOf("name: t\ndata: {train: data/train.tsv}\n"),
            "job.yaml:2:7: data.tokenizer: required: a tokenizer mapping (or a model.init folder that holds its "
            "tokenizer)");
}

TEST_F(JobSpecTest, AModelInitNameIsFoundInTheHuggingFaceCache) {
  const fs::path repo = dir_ / "hf_home" / "hub" / "models--org--tiny-bert";
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "0123abcd\n";
  HfFolder(repo / "snapshots" / "0123abcd", {{"vocab.txt", "[PAD]\n"}});
  const char* previous = std::getenv("HF_HOME");
  const std::string saved = previous ? previous : "";
  ::unsetenv("HF_HUB_CACHE");
  ::setenv("HF_HOME", (dir_ / "hf_home").c_str(), 1);
  const JobSpec spec = Parse("name: t\ndata: {train: data/train.tsv}\nmodel: {init: org/tiny-bert}\n");
  EXPECT_EQ(spec.model.init, (repo / "snapshots" / "0123abcd").string());
  EXPECT_EQ(spec.data.tokenizer.vocab, (repo / "snapshots" / "0123abcd" / "vocab.txt").string());
  EXPECT_EQ(ErrorOf("name: t\ndata: {train: data/train.tsv}\nmodel: {init: org/other}\n"),
            "job.yaml:3:15: model.init: no folder " + (dir_ / "org/other").string() +
                ", nor a model 'org/other' in the Hugging Face cache " + (dir_ / "hf_home" / "hub").string() +
                " (huggingface-cli download org/other puts it there)");
  if (previous)
    ::setenv("HF_HOME", saved.c_str(), 1);
  else
    ::unsetenv("HF_HOME");
}

TEST_F(JobSpecTest, CpuBlockCacheIsAMebibyteCountAndZeroTurnsItOff) {
  EXPECT_EQ(Parse(Valid()).runtime.cpu_block_cache_mb, 512);
  EXPECT_EQ(Parse(Valid() + "runtime: {cpu_block_cache_mb: 0}\n").runtime.cpu_block_cache_mb, 0);
  EXPECT_EQ(Parse(Valid() + "runtime: {cpu_block_cache_mb: 2048}\n").runtime.cpu_block_cache_mb, 2048);
  EXPECT_NE(ErrorOf(Valid() + "runtime: {cpu_block_cache_mb: -1}\n").find("runtime.cpu_block_cache_mb"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "runtime: {cpu_block_cache_mb: lots}\n").find("runtime.cpu_block_cache_mb"),
            std::string::npos);
}

TEST_F(JobSpecTest, MlflowNeedsAnHttpUriAndParamsAreTheFilesOwnValues) {
  JobSpec spec = Parse(Valid() + "log: {mlflow: {uri: 'http://127.0.0.1:5000/', experiment: langid}}\n");
  EXPECT_EQ(spec.log.mlflow_uri, "http://127.0.0.1:5000");  // the trailing slash goes
  EXPECT_EQ(spec.log.mlflow_experiment, "langid");
  EXPECT_EQ(Parse(Valid()).log.mlflow_uri, "");
  EXPECT_EQ(Parse(Valid() + "log: {mlflow: {uri: 'https://mlflow.example.com'}}\n").log.mlflow_experiment, "Default");
  for (const std::string bad : {"file:///tmp/mlruns", "127.0.0.1:5000", "http://", "http:// spaced", "ftp://host"}) {
    const std::string error = ErrorOf(Valid() + "log: {mlflow: {uri: '" + bad + "'}}\n");
    EXPECT_NE(error.find("log.mlflow.uri: expected http://HOST"), std::string::npos) << bad << ": " << error;
  }
  EXPECT_NE(ErrorOf(Valid() + "log: {mlflow: {experiment: x}}\n").find("log.mlflow.uri: required"), std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "log: {mlflow: {uri: 'http://h', experiment: ''}}\n").find("log.mlflow.experiment"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "log: {mlflow: {uri: 'http://h', run_nam: x}}\n").find("did you mean 'run_name'"),
            std::string::npos);
  // What the file said, by key path: MLflow's params.
  const JobSpec with_lists = Parse(Valid() + "log: {steps_every: 5}\n");
  EXPECT_EQ(with_lists.values.at("log.steps_every"), "5");
  EXPECT_EQ(with_lists.values.at("train.epochs"), "2");
  EXPECT_EQ(with_lists.values.count("log.progress"), 0u);
}

TEST_F(JobSpecTest, TraceKeepsABoundedNumberOfSteps) {
  JobSpec spec = Parse(Valid() + "log: {trace: true, trace_steps: 20}\n");
  EXPECT_TRUE(spec.log.trace);
  EXPECT_EQ(spec.log.trace_steps, 20);
  EXPECT_FALSE(Parse(Valid()).log.trace);
  EXPECT_NE(ErrorOf(Valid() + "log: {trace_steps: 0}\n").find("log.trace_steps"), std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "log: {trace: maybe}\n").find("log.trace: expected true or false"), std::string::npos);
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
  const std::string path = SourcePath("configs/jobs/langid_tiny.yaml");
  try {
    LoadJobSpec(path);
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("file not found"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

class ServeSpecTest : public JobSpecTest {
 protected:
  static std::string Serve(const std::string& extra = "") {
    return "name: s\nkind: serve\nserve:\n  repository: data\n" + extra;
  }
};

TEST_F(ServeSpecTest, DefaultsAreLoopbackAndTheUsualPorts) {
  const JobSpec spec = Parse(Serve("  preferred_batch_sizes: [4, 8]\n  max_queue_delay_ms: 2.5\n"));
  EXPECT_EQ(spec.kind, JobKind::kServe);
  EXPECT_EQ(spec.serve.repository, (dir_ / "data").string());
  EXPECT_EQ(spec.serve.host, "127.0.0.1");
  EXPECT_EQ(spec.serve.http_port, 8000);
  EXPECT_EQ(spec.serve.grpc_port, 8001);
  EXPECT_EQ(spec.serve.metrics_port, 8002);
  EXPECT_EQ(spec.serve.preferred_batch_sizes, (std::vector<int>{4, 8}));
  EXPECT_DOUBLE_EQ(spec.serve.max_queue_delay_ms, 2.5);
  EXPECT_TRUE(spec.serve.access_token.empty());
  EXPECT_DOUBLE_EQ(spec.serve.keep_alive_s, 60);
  EXPECT_DOUBLE_EQ(Parse(Serve("  keep_alive_s: 0.5\n")).serve.keep_alive_s, 0.5);
  EXPECT_TRUE(spec.serve.cuda_graphs);
  EXPECT_FALSE(Parse(Serve("  cuda_graphs: false\n")).serve.cuda_graphs);
}

TEST_F(ServeSpecTest, BadServeJobsAreLocatedErrors) {
  EXPECT_NE(ErrorOf("name: s\nkind: serve\n").find("serve.repository: required"), std::string::npos);
  EXPECT_NE(ErrorOf(Serve() + "data:\n  train: data/train.tsv\n").find("data: not used by kind: serve"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Serve("  host: 0.0.0.0\n")).find("job.yaml:5:9: serve.host"), std::string::npos);
  EXPECT_NE(ErrorOf(Serve("  max_batch_size: 4\n  preferred_batch_sizes: [8]\n")).find("preferred_batch_sizes[0]"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Serve("  http_port: 70000\n")).find("serve.http_port"), std::string::npos);
  EXPECT_NE(ErrorOf(Serve("  keep_alive_s: 0\n")).find("serve.keep_alive_s"), std::string::npos);
  EXPECT_NE(ErrorOf("name: s\nkind: serve\nserve:\n  repository: nowhere\n").find("folder not found"),
            std::string::npos);
  std::ofstream(dir_ / "short_token") << "short\n";
  EXPECT_NE(ErrorOf(Serve("  access_token_file: short_token\n")).find("at least 16"), std::string::npos);
  EXPECT_NE(ErrorOf(Valid() + "serve:\n  poll_s: 1\n").find("only used by kind: serve"), std::string::npos);
}

TEST_F(ServeSpecTest, AnAccessTokenOpensOtherAddresses) {
  std::ofstream(dir_ / "token") << "0123456789abcdef-token\n";
  const JobSpec spec = Parse(Serve("  host: 0.0.0.0\n  access_token_file: token\n"));
  EXPECT_EQ(spec.serve.access_token, "0123456789abcdef-token");
}

// distributed.elastic (Note [Elastic finetune]): its replicas and join window, and each
// thing elastic steps cannot run refused at its line.
TEST_F(JobSpecTest, ElasticReplicasAreReadAndWhatElasticStepsCannotRunIsRefused) {
  const JobSpec spec =
      Parse(Valid() + "distributed:\n  timeout_s: 20\n  elastic:\n    min_replicas: 2\n    max_replicas: 3\n");
  EXPECT_TRUE(spec.distributed.elastic.enabled());
  EXPECT_EQ(spec.distributed.elastic.min_replicas, 2);
  EXPECT_EQ(spec.distributed.elastic.max_replicas, 3);
  EXPECT_EQ(spec.distributed.elastic.join_window_s, 10);
  EXPECT_FALSE(Parse(Valid()).distributed.elastic.enabled());
  const std::string elastic = "distributed:\n  elastic:\n    max_replicas: 3\n";
  EXPECT_EQ(ErrorOf(Valid() + "distributed:\n  elastic:\n    min_replicas: 4\n    max_replicas: 3\n"),
            "job.yaml:10:19: distributed.elastic.min_replicas: at most max_replicas (3), got 4");
  EXPECT_EQ(ErrorOf(Valid() + "distributed:\n  elastic:\n    min_replicas: 1\n"),
            "job.yaml:10:5: distributed.elastic.max_replicas: required: the replicas at full strength");
  EXPECT_NE(ErrorOf(Valid() + "distributed:\n  elastic:\n    max_replica: 3\n").find("did you mean"),
            std::string::npos);
  EXPECT_EQ(Parse(Valid() + "resources:\n  ranks: 2\n" + elastic).resources.ranks, 2) << "a replica of two ranks";
  EXPECT_EQ(ErrorOf(Valid("  cuda_graph: true\n") + elastic),
            "job.yaml:11:5: distributed.elastic: elastic steps are not graphed: train.cuda_graph must not be true");
  EXPECT_EQ(ErrorOf("kind: benchmark\n" + Valid() + elastic).find("distributed.elastic: only kind: finetune"),
            std::string("job.yaml:11:5: ").size());
}

}  // namespace
}  // namespace trainyard
