#include "common/spec/job_spec.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include "common/bounded_json.h"
#include "common/module_pattern.h"
#include "common/regular_file.h"
#include "common/spec/spec_overrides.h"
#include "common/spec/spec_reader.h"
#include "common/spec/yaml_budget.h"
#include "common/tokenizer_json.h"

namespace trainyard {
namespace {

// The YAML spelling of each enum value: what parsing accepts and ToString prints.
const std::map<std::string, Precision> kPrecisionNames = {
    {"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}};
const std::map<std::string, JobKind> kJobKindNames = {{"finetune", JobKind::kFinetune},
                                                      {"benchmark", JobKind::kBenchmark},
                                                      {"inference", JobKind::kInference},
                                                      {"generate", JobKind::kGenerate},
                                                      {"serve", JobKind::kServe}};
const std::map<std::string, TaskKind> kTaskNames = {{"classification", TaskKind::kClassification},
                                                    {"causal_lm", TaskKind::kCausalLm}};
const std::map<std::string, ForwardMode> kForwardModeNames = {{"eager", ForwardMode::kEager},
                                                              {"torchscript", ForwardMode::kTorchScript},
                                                              {"cuda_graph", ForwardMode::kCudaGraph},
                                                              {"int8", ForwardMode::kInt8},
                                                              {"aoti", ForwardMode::kAoti}};

template <typename E>
const char* NameOf(const std::map<std::string, E>& names, E value) {
  for (const auto& [name, v] : names)
    if (v == value) return name.c_str();
  return "?";
}

namespace fs = std::filesystem;
using spec_reader::EditDistance;
using spec_reader::IsSafeName;
using spec_reader::Join;
using spec_reader::kMaxNameLength;
using spec_reader::PathKind;
using spec_reader::PathProblem;
using spec_reader::SpecReader;

// Upper bounds of the integer fields (docs/job-file.md): far above any real job,
// low enough that products such as batch_size x ranks or steps as doubles stay exact.
constexpr int64_t kMaxSteps = 1'000'000'000'000;  // steps, step counts and cadences
constexpr int64_t kMaxEpochs = 100'000;
constexpr int64_t kMaxBatch = 65'536;   // examples per rank in one batch
constexpr int64_t kMaxSeqLen = 32'768;  // tokens
constexpr int kMaxPadBuckets = 64;
constexpr int64_t kMaxRanks = 65'536;
constexpr int64_t kMaxThreads = 4'096;
constexpr int64_t kMaxCount = 1'000'000;  // iterations, windows, vocabulary sizes
constexpr size_t kMaxJobFileBytes = size_t(16) << 20;
// What any job file must keep to, however it arrives (ParseJobSpec).
constexpr YamlBudget kJobFileBudget{kMaxJobFileBytes, 1'000'000, 32};

// An MLflow tracking URI the worker can speak to: http or https, a host, no spaces or
// control characters.
bool PlausibleTrackingUri(const std::string& uri) {
  const size_t scheme_end = uri.find("://");
  if (scheme_end == std::string::npos) return false;
  const std::string scheme = uri.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") return false;
  const std::string rest = uri.substr(scheme_end + 3);
  if (rest.empty() || rest[0] == '/' || rest[0] == ':' || uri.size() > 2048) return false;
  return std::none_of(uri.begin(), uri.end(), [](char c) { return static_cast<unsigned char>(c) <= ' '; });
}

// Without a data.tokenizer mapping, a job whose model.init is given takes the folder's
// own tokenizer (TokenizerOfInit, once model.init is read).
void ParseTokenizer(const SpecReader& r, const YAML::Node& data, bool init_given, DataSpec* out) {
  const std::string path = "data.tokenizer";
  YAML::Node node = data["tokenizer"];
  if ((!node.IsDefined() || node.IsNull()) && init_given) return;
  if (!node.IsDefined() || node.IsNull())
    r.Fail(data, path, "required: a tokenizer mapping (or a model.init folder that holds its tokenizer)");
  r.CheckKeys(node, path,
              {"kind", "vocab", "lowercase", "model", "vocab_size", "merges", "add_prefix_space", "template"});
  TokenizerSpec& t = out->tokenizer;
  r.ReadEnum(node, "kind", path,
             std::map<std::string, TokenizerKind>{{"wordpiece", TokenizerKind::kWordPiece},
                                                  {"sentencepiece", TokenizerKind::kSentencePiece},
                                                  {"bpe", TokenizerKind::kByteLevelBpe}},
             &t.kind);
  r.ReadBool(node, "lowercase", path, &t.lowercase);
  r.ReadInt(node, "vocab_size", path, &t.vocab_size, 16, kMaxCount);
  r.ReadBool(node, "add_prefix_space", path, &t.add_prefix_space);
  r.ReadEnum(node, "template", path,
             std::map<std::string, BpeTemplate>{
                 {"auto", BpeTemplate::kAuto}, {"roberta", BpeTemplate::kRoberta}, {"gpt2", BpeTemplate::kGpt2}},
             &t.bpe_template);
  if (t.kind == TokenizerKind::kWordPiece) {
    if (!r.ReadPath(node, "vocab", path, &t.vocab, PathKind::kFile))
      r.Fail(node, path + ".vocab", "required for a wordpiece tokenizer: path to vocab.txt");
  } else if (t.kind == TokenizerKind::kByteLevelBpe) {
    if (!r.ReadPath(node, "vocab", path, &t.vocab, PathKind::kFile))
      r.Fail(node, path + ".vocab", "required for a bpe tokenizer: path to vocab.json");
    if (!r.ReadPath(node, "merges", path, &t.merges, PathKind::kFile))
      r.Fail(node, path + ".merges", "required for a bpe tokenizer: path to merges.txt");
  } else {
    // A missing SentencePiece model is trained from the train split on first use.
    if (!r.ReadPath(node, "model", path, &t.model, PathKind::kFileIfPresent))
      r.Fail(node, path + ".model", "required for a sentencepiece tokenizer: path to a .model");
  }
}

void ParseData(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  const YAML::Node given = root["data"];
  const YAML::Node model = root["model"];
  const bool init_given = model.IsDefined() && model.IsMap() && model["init"].IsDefined() && !model["init"].IsNull();
  const bool needs_train = spec->kind != JobKind::kInference && spec->kind != JobKind::kGenerate;
  // A generate or inference job with model.init may leave data out: the folder has the
  // tokenizer, and nothing else of data is needed.
  const bool absent = !given.IsDefined() || given.IsNull();
  if (absent && (needs_train || !init_given)) r.Fail(root, "data", "required: a data mapping");
  const YAML::Node d = absent ? YAML::Node(YAML::NodeType::Map) : given;
  r.CheckKeys(d, "data",
              {"train", "dev", "labels", "format", "text_field", "label_field", "tokenizer", "max_seq_len",
               "bucket_batches", "pad_buckets", "prefetch_batches", "loader_threads"});
  DataSpec& out = spec->data;
  if (!r.ReadPath(d, "train", "data", &out.train, PathKind::kFile) && needs_train)
    r.Fail(d, "data.train",
           spec->kind == JobKind::kFinetune ? "required: path to the training file (.tsv or .jsonl)"
                                            : "required: the text file benchmark inputs are tokenized from");
  r.ReadPath(d, "dev", "data", &out.dev, PathKind::kFile);
  r.ReadPath(d, "labels", "data", &out.labels, PathKind::kFile);
  const fs::path extension = fs::path(out.train.empty() ? spec->inference.input : out.train).extension();
  out.format = extension == ".jsonl" ? DataFormat::kJsonl : extension == ".txt" ? DataFormat::kText : DataFormat::kTsv;
  r.ReadEnum(d, "format", "data",
             std::map<std::string, DataFormat>{
                 {"tsv", DataFormat::kTsv}, {"jsonl", DataFormat::kJsonl}, {"text", DataFormat::kText}},
             &out.format);
  // A causal LM reads plain text, a classifier labelled examples.
  const bool causal = spec->task == TaskKind::kCausalLm;
  if (spec->kind == JobKind::kFinetune && causal != (out.format == DataFormat::kText))
    r.Fail(d["format"].IsDefined() ? d["format"] : d["train"], "data.format",
           causal ? "task: causal_lm trains on plain text (format: text, one text a line)"
                  : "format: text has no labels; use tsv or jsonl, or task: causal_lm");
  r.ReadString(d, "text_field", "data", &out.text_field);
  r.ReadString(d, "label_field", "data", &out.label_field);
  r.ReadInt(d, "max_seq_len", "data", &out.max_seq_len, 8, kMaxSeqLen);
  r.ReadInt(d, "bucket_batches", "data", &out.bucket_batches, 1, kMaxCount);
  r.ReadInt(d, "pad_buckets", "data", &out.pad_buckets, 0, kMaxPadBuckets);
  r.ReadInt(d, "prefetch_batches", "data", &out.prefetch_batches, 0, 1024);
  r.ReadInt(d, "loader_threads", "data", &out.loader_threads, 1, 256);
  ParseTokenizer(r, d, init_given, &out);
}

// A tokenizer.json's kind and settings, read (and so checked) now: a file the worker
// cannot use is bad input at the start, naming model.init.
void TokenizerOfJson(const std::string& path, const SpecReader& r, const YAML::Node& init, TokenizerSpec* t) {
  try {
    const HfTokenizerFiles files = ReadTokenizerJson(path);
    t->kind =
        files.model == HfTokenizerFiles::Model::kWordPiece ? TokenizerKind::kWordPiece : TokenizerKind::kByteLevelBpe;
    t->lowercase = files.lowercase;
    t->add_prefix_space = files.add_prefix_space;
    t->tokenizer_json = path;
  } catch (const std::runtime_error& e) {
    r.Fail(init, "model.init", std::string("its tokenizer (data.tokenizer is absent): ") + e.what());
  }
}

// A model.init folder's tokenizer, where HF's AutoTokenizer finds it: vocab.txt
// (WordPiece; tokenizer_config.json's do_lower_case, default true), or vocab.json with
// merges.txt (byte-level BPE; its add_prefix_space, default false), or else
// tokenizer.json (its own settings).
void TokenizerOfInit(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  const fs::path folder = spec->model.init;
  const FileRead read = ReadUserFile((folder / "tokenizer_config.json").string(), size_t(1) << 20);
  const nlohmann::json config =
      read.status == FileRead::kOk ? ParseBoundedJsonOrDiscarded(read.bytes) : nlohmann::json::object();
  auto flag = [&](const char* key, bool fallback) {
    return config.is_object() && config.contains(key) && config[key].is_boolean() ? config[key].get<bool>() : fallback;
  };
  auto present = [&](const char* file) { return PathProblem(folder / file, PathKind::kFile).empty(); };
  TokenizerSpec& t = spec->data.tokenizer;
  if (present("vocab.txt")) {
    t.kind = TokenizerKind::kWordPiece;
    t.vocab = (folder / "vocab.txt").string();
    t.lowercase = flag("do_lower_case", true);
  } else if (present("vocab.json") && present("merges.txt")) {
    t.kind = TokenizerKind::kByteLevelBpe;
    t.vocab = (folder / "vocab.json").string();
    t.merges = (folder / "merges.txt").string();
    t.add_prefix_space = flag("add_prefix_space", false);
  } else if (present("tokenizer.json")) {
    TokenizerOfJson((folder / "tokenizer.json").string(), r, root["model"]["init"], &t);
  } else {
    r.Fail(root["model"]["init"], "data.tokenizer",
           "absent, and the model.init folder holds no vocab.txt, vocab.json with merges.txt, or tokenizer.json: give "
           "data.tokenizer");
  }
}

bool LooksLikeHubName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name[0] == '.' || name.find("..") != std::string::npos) return false;
  if (std::count(name.begin(), name.end(), '/') > 1 || name.front() == '/' || name.back() == '/') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/';
  });
}

// The Hugging Face hub cache, as huggingface_hub finds it offline: $HF_HUB_CACHE, else
// $HF_HOME/hub, else ~/.cache/huggingface/hub.
fs::path HubCache() {
  if (const char* hub = std::getenv("HF_HUB_CACHE"); hub && *hub) return hub;
  if (const char* home = std::getenv("HF_HOME"); home && *home) return fs::path(home) / "hub";
  const char* user = std::getenv("HOME");
  return fs::path(user && *user ? user : "/") / ".cache" / "huggingface" / "hub";
}

// A hub model name ("bert-base-uncased", "org/name") as the cache holds it:
// models--<org>--<name>/snapshots/<the revision refs/main names>. Empty when absent.
std::string HubSnapshot(const std::string& name) {
  const size_t slash = name.find('/');
  const std::string flat = slash == std::string::npos ? name : name.substr(0, slash) + "--" + name.substr(slash + 1);
  const fs::path repo = HubCache() / ("models--" + flat);
  const FileRead ref = ReadUserFile((repo / "refs" / "main").string(), 256);
  if (ref.status != FileRead::kOk) return "";
  std::string revision = ref.bytes.substr(0, ref.bytes.find_first_of("\r\n"));
  if (revision.empty() || !std::all_of(revision.begin(), revision.end(),
                                       [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
    return "";
  const fs::path snapshot = repo / "snapshots" / revision;
  return PathProblem(snapshot, PathKind::kFolder).empty() ? snapshot.string() : "";
}

// model.init: a folder, or the name of a model in the Hugging Face cache.
void ReadModelInit(const SpecReader& r, const YAML::Node& m, JobSpec* spec) {
  std::string raw;
  if (!r.ReadString(m, "init", "model", &raw)) return;
  std::error_code error;
  const bool on_disk = !raw.empty() && fs::exists(r.Resolve(raw), error);
  const std::string cached = !on_disk && LooksLikeHubName(raw) ? HubSnapshot(raw) : "";
  if (!cached.empty())
    spec->model.init = cached;
  else if (!on_disk && LooksLikeHubName(raw))
    r.Fail(m["init"], "model.init",
           "no folder " + r.Resolve(raw).string() + ", nor a model '" + raw + "' in the Hugging Face cache " +
               HubCache().string() + " (huggingface-cli download " + raw + " puts it there)");
  else
    r.ReadPath(m, "init", "model", &spec->model.init, PathKind::kFolder);
  for (const char* file : {"model.safetensors", "config.json"})
    if (std::string problem = PathProblem(fs::path(spec->model.init) / file, PathKind::kFile); !problem.empty())
      r.Fail(m["init"], "model.init", "expected a folder holding model.safetensors and config.json: " + problem);
}

void ParseLora(const SpecReader& r, const YAML::Node& model, JobSpec* spec) {
  YAML::Node l = model["lora"];
  if (!l.IsDefined()) return;
  LoraSpec& out = spec->model.lora;
  out.enabled = true;  // `lora:` alone means PEFT's defaults
  if (l.IsNull()) return;
  r.CheckKeys(l, "model.lora",
              {"r", "alpha", "dropout", "target_modules", "modules_to_save", "use_rslora", "merge", "adapter"});
  r.ReadInt(l, "r", "model.lora", &out.r, 1, 65536);
  r.ReadDouble(l, "alpha", "model.lora", &out.alpha, 1e-6, 1e6);
  r.ReadDouble(l, "dropout", "model.lora", &out.dropout, 0.0, 0.9);
  auto name = [&](const YAML::Node& item, const std::string&) { return item.Scalar(); };
  if (l["target_modules"].IsScalar()) {  // PEFT's string form: the whole module name matches it as a regex
    out.target_regex = l["target_modules"].Scalar();
    std::string error;
    if (!ModulePattern::Compile(out.target_regex, &error)) {
      const std::string shown =
          out.target_regex.size() > 80 ? out.target_regex.substr(0, 80) + "..." : out.target_regex;
      r.Fail(l["target_modules"], "model.lora.target_modules",
             "expected a list of module names or a regex string: '" + shown + "' is not a regex RE2 accepts (" + error +
                 "; RE2 takes Python's syntax without lookaround or backreferences)");
    }
  } else {
    r.ReadList(l, "target_modules", "model.lora", &out.target_modules, name);
  }
  r.ReadList(l, "modules_to_save", "model.lora", &out.modules_to_save, name);
  r.ReadBool(l, "use_rslora", "model.lora", &out.use_rslora);
  r.ReadBool(l, "merge", "model.lora", &out.merge);
  if (r.ReadPath(l, "adapter", "model.lora", &out.adapter, PathKind::kFolder))
    for (const char* file : {"adapter_model.safetensors", "adapter_config.json"})
      if (std::string problem = PathProblem(fs::path(out.adapter) / file, PathKind::kFile); !problem.empty())
        r.Fail(l["adapter"], "model.lora.adapter",
               "expected a folder holding adapter_model.safetensors and adapter_config.json: " + problem);
}

void ParseModel(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node m = r.Section(root, "model", {"family", "preset", "init", "dropout", "unpad", "fused_kernels", "lora"});
  r.ReadEnum(m, "family", "model",
             std::map<std::string, std::string>{
                 {"bert", "bert"}, {"roberta", "roberta"}, {"distilbert", "distilbert"}, {"gpt2", "gpt2"}},
             &spec->model.family);
  r.ReadEnum(m, "preset", "model",
             std::map<std::string, std::string>{{"tiny", "tiny"}, {"mini", "mini"}, {"base", "base"}},
             &spec->model.preset);
  ReadModelInit(r, m, spec);
  r.ReadDouble(m, "dropout", "model", &spec->model.dropout, 0.0, 0.9);
  r.ReadEnum(m, "unpad", "model",
             std::map<std::string, std::string>{{"auto", "auto"}, {"always", "always"}, {"never", "never"}},
             &spec->model.unpad);
  r.ReadEnum(m, "fused_kernels", "model",
             std::map<std::string, std::string>{{"auto", "auto"}, {"true", "true"}, {"false", "false"}},
             &spec->model.fused_kernels);
  ParseLora(r, m, spec);
}

void ParseTrain(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node t = r.Section(root, "train",
                           {"epochs", "batch_size", "gradient_accumulation_steps", "max_steps", "lr", "lr_schedule",
                            "weight_decay", "warmup_ratio", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_eps",
                            "precision", "bf16_weights", "loss_scale", "cuda_graph", "early_stopping"});
  TrainSpec& out = spec->train;
  r.ReadInt(t, "epochs", "train", &out.epochs, 1, kMaxEpochs);
  r.ReadInt(t, "batch_size", "train", &out.batch_size, 1, kMaxBatch);
  r.ReadInt(t, "gradient_accumulation_steps", "train", &out.gradient_accumulation_steps, 1, 10000);
  r.ReadInt(t, "max_steps", "train", &out.max_steps, 0, kMaxSteps);
  r.ReadDouble(t, "lr", "train", &out.lr, 0.0, 10.0);
  r.ReadDouble(t, "weight_decay", "train", &out.weight_decay, 0.0, 1.0);
  r.ReadDouble(t, "warmup_ratio", "train", &out.warmup_ratio, 0.0, 1.0);
  r.ReadEnum(
      t, "lr_schedule", "train",
      std::map<std::string, ScheduleKind>{
          {"linear", ScheduleKind::kLinear}, {"cosine", ScheduleKind::kCosine}, {"constant", ScheduleKind::kConstant}},
      &out.lr_schedule);
  r.ReadDouble(t, "max_grad_norm", "train", &out.max_grad_norm, 0.0, 1e6);
  r.ReadDouble(t, "adam_beta1", "train", &out.adam_beta1, 0.0, 0.999999);
  r.ReadDouble(t, "adam_beta2", "train", &out.adam_beta2, 0.0, 0.999999);
  r.ReadDouble(t, "adam_eps", "train", &out.adam_eps, 1e-12, 1.0);
  r.ReadEnum(t, "precision", "train", kPrecisionNames, &out.precision);
  r.ReadBool(t, "bf16_weights", "train", &out.bf16_weights);
  if (out.bf16_weights && out.precision != Precision::kBf16)
    r.Fail(t["bf16_weights"], "train.bf16_weights",
           std::string("bf16 weights need train.precision: bf16, not ") + ToString(out.precision));
  if (out.bf16_weights && spec->model.lora.enabled)
    r.Fail(t["bf16_weights"], "train.bf16_weights",
           "not with model.lora: LoRA trains fp32 adapters on the frozen weights; leave bf16_weights false");
  r.ReadEnum(t, "cuda_graph", "train",
             std::map<std::string, GraphMode>{
                 {"auto", GraphMode::kAuto}, {"true", GraphMode::kOn}, {"false", GraphMode::kOff}},
             &out.cuda_graph);
  YAML::Node ls = t["loss_scale"];
  if (ls.IsDefined() && !ls.IsNull()) {
    const std::string p = "train.loss_scale";
    r.CheckKeys(ls, p, {"init_scale", "growth_factor", "backoff_factor", "growth_interval"});
    r.ReadDouble(ls, "init_scale", p, &out.loss_scale.init_scale, 1.0, 1e38);
    r.ReadDouble(ls, "growth_factor", p, &out.loss_scale.growth_factor, 1.0, 1e6);
    r.ReadDouble(ls, "backoff_factor", p, &out.loss_scale.backoff_factor, 1e-6, 1.0);
    r.ReadInt(ls, "growth_interval", p, &out.loss_scale.growth_interval, 1, 1'000'000'000);
  }
  YAML::Node es = t["early_stopping"];
  if (es.IsDefined() && !es.IsNull()) {
    const std::string p = "train.early_stopping";
    r.CheckKeys(es, p, {"patience", "threshold"});
    out.early_stopping.enabled = true;
    r.ReadInt(es, "patience", p, &out.early_stopping.patience, 1, 1'000'000);
    r.ReadDouble(es, "threshold", p, &out.early_stopping.threshold, 0.0, 1e12);
  }
}

void ParseEval(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node e = r.Section(root, "eval", {"every_steps", "metrics", "test", "batch_size"});
  EvalSpec& out = spec->eval;
  r.ReadInt(e, "every_steps", "eval", &out.every_steps, 0, kMaxSteps);
  const std::vector<std::string>& known = EvalMetricNames(spec->task);
  r.ReadList(e, "metrics", "eval", &out.metrics, [&](const YAML::Node& n, const std::string& path) {
    if (std::find(known.begin(), known.end(), n.Scalar()) == known.end())
      r.Fail(n, path,
             std::string("expected one of ") + Join(known) +
                 " for task: " + (spec->task == TaskKind::kCausalLm ? "causal_lm" : "classification") + ", got '" +
                 n.Scalar() + "' (the loss is always reported)");
    return n.Scalar();
  });
  r.ReadPath(e, "test", "eval", &out.test, PathKind::kFile);
  r.ReadInt(e, "batch_size", "eval", &out.batch_size, 1, kMaxBatch);
  if (out.batch_size == 0) out.batch_size = int(std::min<int64_t>(kMaxBatch, int64_t(spec->train.batch_size) * 2));
}

void ParseCheckpoint(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node c = r.Section(root, "checkpoint", {"every_steps", "keep", "resume", "best_metric", "greater_is_better"});
  r.ReadInt(c, "every_steps", "checkpoint", &spec->checkpoint.every_steps, 0, kMaxSteps);
  r.ReadInt(c, "keep", "checkpoint", &spec->checkpoint.keep, 1, 10'000);
  std::string resume;
  if (r.ReadString(c, "resume", "checkpoint", &resume)) {
    if (resume == "none" || resume == "auto")
      spec->checkpoint.resume = resume;
    else
      r.ReadPath(c, "resume", "checkpoint", &spec->checkpoint.resume, PathKind::kFile);
  }
  std::string& best = spec->checkpoint.best_metric;
  if (!r.ReadString(c, "best_metric", "checkpoint", &best)) return;
  std::vector<std::string> names = {"eval_loss"};
  for (const std::string& metric : EvalMetricNames(spec->task)) names.push_back("eval_" + metric);
  if (std::find(names.begin(), names.end(), best) == names.end())
    r.Fail(c["best_metric"], "checkpoint.best_metric", "expected one of " + Join(names) + ", got '" + best + "'");
  spec->checkpoint.greater_is_better = best != "eval_loss" && best != "eval_perplexity";
  r.ReadBool(c, "greater_is_better", "checkpoint", &spec->checkpoint.greater_is_better);
}

// What evaluates needs a dev set, and what judges evaluations needs its metric.
void CheckEvaluationNeeds(const SpecReader& r, const YAML::Node& root, const JobSpec& spec) {
  const std::vector<std::string>& reported = spec.eval.metrics;
  const std::string& best = spec.checkpoint.best_metric;
  if (!best.empty() && best != "eval_loss" && !reported.empty() &&
      std::find(reported.begin(), reported.end(), best.substr(5)) == reported.end())
    r.Fail(root["checkpoint"]["best_metric"], "checkpoint.best_metric",
           "'" + best + "' is not among eval.metrics; add " + best.substr(5) + " to them");
  if (spec.train.early_stopping.enabled && best.empty())
    r.Fail(root["train"]["early_stopping"], "train.early_stopping",
           "needs checkpoint.best_metric: the metric whose evaluations it judges (e.g. eval_loss)");
  if (!spec.data.dev.empty()) return;
  if (spec.eval.every_steps > 0)
    r.Fail(root["eval"]["every_steps"], "eval.every_steps", "needs data.dev: the split it evaluates");
  if (!best.empty()) r.Fail(root["checkpoint"]["best_metric"], "checkpoint.best_metric", "needs data.dev to judge by");
}

void ParseMlflow(const SpecReader& r, const YAML::Node& log, LogSpec* out) {
  const YAML::Node node = log["mlflow"];
  if (!node.IsDefined() || node.IsNull()) return;
  r.CheckKeys(node, "log.mlflow", {"uri", "experiment", "run_name"});
  if (!r.ReadString(node, "uri", "log.mlflow", &out->mlflow_uri))
    r.Fail(node, "log.mlflow.uri", "required: the tracking server, e.g. http://127.0.0.1:5000");
  if (!PlausibleTrackingUri(out->mlflow_uri))
    r.Fail(node["uri"], "log.mlflow.uri",
           "expected http://HOST[:PORT] or https://HOST[:PORT] (an MLflow tracking server's REST endpoint), got '" +
               out->mlflow_uri + "'");
  while (!out->mlflow_uri.empty() && out->mlflow_uri.back() == '/') out->mlflow_uri.pop_back();
  r.ReadString(node, "experiment", "log.mlflow", &out->mlflow_experiment);
  if (out->mlflow_experiment.empty() || out->mlflow_experiment.size() > 500)
    r.Fail(node["experiment"], "log.mlflow.experiment", "expected a name of 1 to 500 characters");
  r.ReadString(node, "run_name", "log.mlflow", &out->mlflow_run_name);
  if (out->mlflow_run_name.size() > 250)
    r.Fail(node["run_name"], "log.mlflow.run_name", "expected at most 250 characters");
}

void ParseRuntime(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node rt =
      r.Section(root, "runtime", {"device", "threads", "tf32", "cpu_gemm", "weight_casts", "cpu_block_cache_mb"});
  r.ReadEnum(rt, "device", "runtime",
             std::map<std::string, DeviceChoice>{
                 {"auto", DeviceChoice::kAuto}, {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda}},
             &spec->runtime.device);
  if (spec->model.fused_kernels == "true" && spec->runtime.device == DeviceChoice::kCpu)
    r.Fail(root["model"]["fused_kernels"], "model.fused_kernels",
           "the fused kernels are CUDA kernels; they cannot run with runtime.device: cpu");
  r.ReadInt(rt, "threads", "runtime", &spec->runtime.threads, 0, kMaxThreads);
  r.ReadBool(rt, "tf32", "runtime", &spec->runtime.tf32);
  r.ReadEnum(rt, "cpu_gemm", "runtime",
             std::map<std::string, std::string>{{"auto", "auto"}, {"mkl", "mkl"}, {"onednn", "onednn"}},
             &spec->runtime.cpu_gemm);
  r.ReadEnum(rt, "weight_casts", "runtime",
             std::map<std::string, std::string>{{"once", "once"}, {"each_pass", "each_pass"}},
             &spec->runtime.weight_casts);
  r.ReadInt(rt, "cpu_block_cache_mb", "runtime", &spec->runtime.cpu_block_cache_mb, 0, int64_t(1) << 20);
}

void ParseResources(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node rs =
      r.Section(root, "resources", {"ranks", "device", "priority", "max_restarts", "estimate_minutes", "preemptible"});
  r.ReadInt(rs, "ranks", "resources", &spec->resources.ranks, 1, kMaxRanks);
  r.ReadEnum(rs, "device", "resources",
             std::map<std::string, std::string>{{"cpu", "cpu"}, {"cuda", "cuda"}, {"any", "any"}},
             &spec->resources.device);
  r.ReadInt(rs, "priority", "resources", &spec->resources.priority, -1'000'000, 1'000'000);
  r.ReadInt(rs, "max_restarts", "resources", &spec->resources.max_restarts, 0, 1'000);
  r.ReadDouble(rs, "estimate_minutes", "resources", &spec->resources.estimate_minutes, 0.0, 1e7);
  r.ReadBool(rs, "preemptible", "resources", &spec->resources.preemptible);
}

// distributed.elastic, checked against what elastic steps can run (Note [Elastic
// finetune]): a finetune job, no graphed steps or per-step hash. A replica is
// resources.ranks ranks (Note [Elastic replica of several ranks]).
void ParseElastic(const SpecReader& r, const YAML::Node& node, JobSpec& spec) {
  constexpr int kMaxReplicas = 256;
  const std::string path = "distributed.elastic";
  r.CheckKeys(node, path, {"min_replicas", "max_replicas", "join_window_s"});
  const YAML::Node& e = node;
  ElasticSpec& out = spec.distributed.elastic;
  if (!e["max_replicas"].IsDefined()) r.Fail(node, path + ".max_replicas", "required: the replicas at full strength");
  r.ReadInt(e, "max_replicas", path, &out.max_replicas, 1, kMaxReplicas);
  r.ReadInt(e, "min_replicas", path, &out.min_replicas, 1, kMaxReplicas);
  r.ReadDouble(e, "join_window_s", path, &out.join_window_s, 0.0, 3600.0);
  if (out.min_replicas > out.max_replicas)
    r.Fail(e["min_replicas"], path + ".min_replicas",
           "at most max_replicas (" + std::to_string(out.max_replicas) + "), got " + std::to_string(out.min_replicas));
  if (spec.kind != JobKind::kFinetune) r.Fail(node, path, "only kind: finetune trains elastically");
  if (spec.train.cuda_graph == GraphMode::kOn)
    r.Fail(node, path, "elastic steps are not graphed: train.cuda_graph must not be true");
  if (spec.distributed.check_consistency)
    r.Fail(node, path, "every replica applies the same summed gradients: distributed.check_consistency is not used");
}

void ParseDistributed(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node ds =
      r.Section(root, "distributed",
                {"backend", "bucket_mb", "overlap", "compression", "timeout_s", "check_consistency", "elastic"});
  DistributedSpec& dist = spec->distributed;
  r.ReadEnum(ds, "backend", "distributed",
             std::map<std::string, CommBackend>{
                 {"auto", CommBackend::kAuto}, {"mpi", CommBackend::kMpi}, {"nccl", CommBackend::kNccl}},
             &dist.backend);
  r.ReadDouble(ds, "bucket_mb", "distributed", &dist.bucket_mb, 0.001, 4096.0);
  r.ReadBool(ds, "overlap", "distributed", &dist.overlap);
  r.ReadEnum(ds, "compression", "distributed", std::map<std::string, bool>{{"none", false}, {"fp16", true}},
             &dist.fp16_compression);
  r.ReadDouble(ds, "timeout_s", "distributed", &dist.timeout_s, 0.1, 86400.0);
  r.ReadBool(ds, "check_consistency", "distributed", &dist.check_consistency);
  if (ds["elastic"].IsDefined()) ParseElastic(r, ds["elastic"], *spec);
}

void ParseDebugAndLog(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node dbg =
      r.Section(root, "debug", {"force_loss_scaling", "plant_inf_step", "plant_inf_rank", "step_pause_ms"});
  r.ReadBool(dbg, "force_loss_scaling", "debug", &spec->debug.force_loss_scaling);
  r.ReadInt(dbg, "plant_inf_step", "debug", &spec->debug.plant_inf_step, -1, kMaxSteps);
  r.ReadInt(dbg, "plant_inf_rank", "debug", &spec->debug.plant_inf_rank, 0, kMaxRanks - 1);
  r.ReadInt(dbg, "step_pause_ms", "debug", &spec->debug.step_pause_ms, 0, 10000);
  YAML::Node lg = r.Section(
      root, "log",
      {"runs_dir", "steps_every", "progress", "profile_steps", "profile_from_step", "trace", "trace_steps", "mlflow"});
  r.ReadPath(lg, "runs_dir", "log", &spec->log.runs_dir, PathKind::kAny);
  r.ReadInt(lg, "steps_every", "log", &spec->log.steps_every, 1, 1'000'000'000);
  r.ReadBool(lg, "progress", "log", &spec->log.progress);
  r.ReadInt(lg, "profile_steps", "log", &spec->log.profile_steps, 0, 10'000);
  r.ReadInt(lg, "profile_from_step", "log", &spec->log.profile_from_step, 1, kMaxSteps);
  r.ReadBool(lg, "trace", "log", &spec->log.trace);
  r.ReadInt(lg, "trace_steps", "log", &spec->log.trace_steps, 1, 100'000);
  ParseMlflow(r, lg, &spec->log);
}

// The sections every kind of job reads.
void ParseRest(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  ParseCheckpoint(r, root, spec);
  ParseRuntime(r, root, spec);
  ParseResources(r, root, spec);
  ParseDistributed(r, root, spec);
  ParseDebugAndLog(r, root, spec);
}

void ParseBenchmark(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node b = r.Section(root, "benchmark",
                           {"mode", "batch_sizes", "seq_lens", "precisions", "modes", "torchscript", "aoti", "warmup",
                            "iters", "max_cv", "max_remeasure", "memory_cap_mb", "train_steps", "new_tokens"});
  BenchmarkSpec& out = spec->benchmark;
  r.ReadEnum(b, "mode", "benchmark",
             std::map<std::string, BenchmarkRun>{{"sweep", BenchmarkRun::kSweep},
                                                 {"train_step", BenchmarkRun::kTrainStep},
                                                 {"generate", BenchmarkRun::kGenerate}},
             &out.run);
  const bool generates = out.run == BenchmarkRun::kGenerate;
  if (generates && spec->task != TaskKind::kCausalLm)
    r.Fail(b["mode"], "benchmark.mode", "generate needs task: causal_lm");
  r.ReadList(b, "batch_sizes", "benchmark", &out.batch_sizes,
             [&](const YAML::Node& n, const std::string& path) { return r.PositiveInt(n, path, kMaxBatch); });
  r.ReadList(b, "seq_lens", "benchmark", &out.seq_lens,
             [&](const YAML::Node& n, const std::string& path) { return r.PositiveInt(n, path, kMaxSeqLen); });
  r.ReadList(b, "precisions", "benchmark", &out.precisions,
             [&](const YAML::Node& n, const std::string& path) { return r.Choice(n, path, kPrecisionNames); });
  r.ReadList(b, "modes", "benchmark", &out.modes,
             [&](const YAML::Node& n, const std::string& path) { return r.Choice(n, path, kForwardModeNames); });
  bool wants_script = false;
  for (ForwardMode m : out.modes) wants_script = wants_script || m == ForwardMode::kTorchScript;
  if (!r.ReadPath(b, "torchscript", "benchmark", &out.torchscript, PathKind::kFile) && wants_script)
    r.Fail(b["modes"], "benchmark.torchscript", "required by the torchscript mode: a .pt file");
  const bool wants_aoti = std::count(out.modes.begin(), out.modes.end(), ForwardMode::kAoti) > 0;
  if (!r.ReadPath(b, "aoti", "benchmark", &out.aoti, PathKind::kFile) && wants_aoti)
    r.Fail(b["modes"], "benchmark.aoti", "required by the aoti mode: a .pt2 package (scripts/export_aoti.py)");
  r.ReadInt(b, "warmup", "benchmark", &out.warmup, 0, kMaxCount);
  r.ReadInt(b, "iters", "benchmark", &out.iters, 2, kMaxCount);
  r.ReadDouble(b, "max_cv", "benchmark", &out.max_cv, 0.0, 10.0);
  r.ReadInt(b, "max_remeasure", "benchmark", &out.max_remeasure, 0, 100);
  r.ReadDouble(b, "memory_cap_mb", "benchmark", &out.memory_cap_mb, 0.0, 1e9);
  r.ReadInt(b, "train_steps", "benchmark", &out.train_steps, 2, kMaxCount);
  r.ReadInt(b, "new_tokens", "benchmark", &out.new_tokens, 2, kMaxSeqLen);
  if (generates)
    for (ForwardMode m : out.modes)
      if (m != ForwardMode::kEager && m != ForwardMode::kCudaGraph)
        r.Fail(b["modes"], "benchmark.modes",
               std::string("mode: generate runs eager or cuda_graph, not ") + ToString(m));
}

void ParseInference(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node n = r.Section(root, "inference", {"input", "output", "batch_size", "sort_by_length", "mode", "aoti"});
  InferenceSpec& out = spec->inference;
  if (!r.ReadPath(n, "input", "inference", &out.input, PathKind::kFile))
    r.Fail(n.IsDefined() ? n : root, "inference.input", "required: the dataset file to predict over");
  r.ReadPath(n, "output", "inference", &out.output, PathKind::kFileIfPresent);
  r.ReadInt(n, "batch_size", "inference", &out.batch_size, 1, kMaxBatch);
  r.ReadEnum(n, "sort_by_length", "inference",
             std::map<std::string, std::string>{{"true", "true"}, {"false", "false"}, {"both", "both"}},
             &out.sort_by_length);
  r.ReadEnum(n, "mode", "inference",
             std::map<std::string, ForwardMode>{
                 {"eager", ForwardMode::kEager}, {"int8", ForwardMode::kInt8}, {"aoti", ForwardMode::kAoti}},
             &out.mode);
  const bool has_package = r.ReadPath(n, "aoti", "inference", &out.aoti, PathKind::kFile);
  if (out.mode == ForwardMode::kAoti && !has_package)
    r.Fail(n, "inference.aoti", "required with mode: aoti: the .pt2 package (scripts/export_aoti.py)");
}

void ParseGenerate(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  YAML::Node n = r.Section(root, "generate",
                           {"prompts", "output", "batch_size", "max_new_tokens", "strategy", "temperature", "top_k",
                            "top_p", "stop", "ignore_stop", "cuda_graph"});
  GenerateSpec& out = spec->generate;
  if (!r.ReadPath(n, "prompts", "generate", &out.prompts, PathKind::kFile))
    r.Fail(n.IsDefined() ? n : root, "generate.prompts", "required: a text file, one prompt a line");
  r.ReadPath(n, "output", "generate", &out.output, PathKind::kFileIfPresent);
  r.ReadInt(n, "batch_size", "generate", &out.batch_size, 1, kMaxBatch);
  r.ReadInt(n, "max_new_tokens", "generate", &out.max_new_tokens, 1, kMaxSeqLen);
  r.ReadEnum(n, "strategy", "generate", std::map<std::string, bool>{{"greedy", false}, {"sample", true}}, &out.sample);
  r.ReadDouble(n, "temperature", "generate", &out.temperature, 1e-3, 100.0);
  r.ReadInt(n, "top_k", "generate", &out.top_k, 0, 1000000);
  r.ReadDouble(n, "top_p", "generate", &out.top_p, 1e-9, 1.0);
  r.ReadList(n, "stop", "generate", &out.stop,
             [&](const YAML::Node& item, const std::string&) { return item.Scalar(); });
  r.ReadBool(n, "ignore_stop", "generate", &out.ignore_stop);
  r.ReadBool(n, "cuda_graph", "generate", &out.cuda_graph);
}

// kind: serve reads its models (weights, tokenizer, labels) from the repository, so it
// has no data, model or train section.
// serve.access_token_file's first line, required for a listener off loopback.
void ReadServeAccessToken(const SpecReader& r, const YAML::Node& n, ServeSpec* out) {
  std::string token_file;
  if (r.ReadPath(n, "access_token_file", "serve", &token_file, PathKind::kFile)) {
    std::ifstream in(token_file);
    std::getline(in, out->access_token);
    if (out->access_token.size() < 16)
      r.Fail(n["access_token_file"], "serve.access_token_file",
             "expected a token of at least 16 characters on its first line");
  }
  const bool loopback = out->host == "127.0.0.1" || out->host == "::1" || out->host == "localhost";
  if (!loopback && out->access_token.empty())
    r.Fail(n["host"], "serve.host", "a listener off loopback needs serve.access_token_file");
}

void ParseServe(const SpecReader& r, const YAML::Node& root, JobSpec* spec) {
  for (const char* unused : {"data", "model", "train", "task"})
    if (root[unused].IsDefined())
      r.Fail(root[unused], unused, "not used by kind: serve (each model version in serve.repository brings its own)");
  YAML::Node n = r.Section(root, "serve",
                           {"repository",
                            "host",
                            "http_port",
                            "grpc_port",
                            "metrics_port",
                            "access_token_file",
                            "max_batch_size",
                            "max_batch_tokens",
                            "preferred_batch_sizes",
                            "max_queue_delay_ms",
                            "max_queue",
                            "default_timeout_ms",
                            "max_body_mb",
                            "keep_alive_s",
                            "request_timeout_s",
                            "max_connections",
                            "grpc_max_connections",
                            "poll_s",
                            "truncate",
                            "length_aware",
                            "cuda_graphs"});
  ServeSpec& out = spec->serve;
  if (!r.ReadPath(n, "repository", "serve", &out.repository, PathKind::kFolder))
    r.Fail(n.IsDefined() ? n : root, "serve.repository", "required: a folder of <model>/<version>/ HF folders");
  r.ReadString(n, "host", "serve", &out.host);
  r.ReadInt(n, "http_port", "serve", &out.http_port, 0, 65535);
  r.ReadInt(n, "grpc_port", "serve", &out.grpc_port, 0, 65535);
  r.ReadInt(n, "metrics_port", "serve", &out.metrics_port, 0, 65535);
  ReadServeAccessToken(r, n, &out);
  r.ReadInt(n, "max_batch_size", "serve", &out.max_batch_size, 1, kMaxBatch);
  r.ReadInt(n, "max_batch_tokens", "serve", &out.max_batch_tokens, 1, 1 << 24);
  r.ReadList(n, "preferred_batch_sizes", "serve", &out.preferred_batch_sizes,
             [&](const YAML::Node& item, const std::string& where) {
               int size = 0;
               if (!YAML::convert<int>::decode(item, size) || size < 1 || size > out.max_batch_size)
                 r.Fail(item, where, "expected a batch size from 1 to serve.max_batch_size");
               return size;
             });
  r.ReadDouble(n, "max_queue_delay_ms", "serve", &out.max_queue_delay_ms, 0.0, 60'000.0);
  r.ReadInt(n, "max_queue", "serve", &out.max_queue, 1, 1'000'000);
  r.ReadDouble(n, "default_timeout_ms", "serve", &out.default_timeout_ms, 1.0, 3'600'000.0);
  r.ReadInt(n, "max_body_mb", "serve", &out.max_body_mb, 1, 1024);
  r.ReadDouble(n, "keep_alive_s", "serve", &out.keep_alive_s, 0.1, 3600);
  r.ReadDouble(n, "request_timeout_s", "serve", &out.request_timeout_s, 0.1, 3600);
  r.ReadInt(n, "max_connections", "serve", &out.max_connections, 16, 1'000'000);
  r.ReadInt(n, "grpc_max_connections", "serve", &out.grpc_max_connections, 16, 1'000'000);
  r.ReadDouble(n, "poll_s", "serve", &out.poll_s, 0.0, 86'400.0);
  r.ReadBool(n, "truncate", "serve", &out.truncate);
  r.ReadBool(n, "length_aware", "serve", &out.length_aware);
  r.ReadBool(n, "cuda_graphs", "serve", &out.cuda_graphs);
}

JobSpec ParseDocument(const SpecReader& r, const YAML::Node& root, const std::string& source) {
  // Before the keys: a search file's own keys (base, search) would be "unknown" here.
  if (root["kind"].IsDefined() && root["kind"].IsScalar() && root["kind"].Scalar() == "search")
    r.Fail(root["kind"], "kind",
           "a search runs on a coordinator, which runs its trials as jobs: submit it with `jobctl submit " + source +
               "` (docs/search.md)");
  r.CheckKeys(root, "",
              {"name", "kind", "task", "seed", "data", "model", "train", "eval", "checkpoint", "runtime", "resources",
               "distributed", "debug", "benchmark", "inference", "generate", "serve", "log"});
  JobSpec spec;
  spec.source_file = source;
  if (!r.ReadString(root, "name", "", &spec.name)) r.Fail(root, "name", "required: the job's name");
  if (!IsSafeName(spec.name))
    r.Fail(root["name"], "name",
           "expected one path component of letters, digits, '.', '_' or '-' (at most " +
               std::to_string(kMaxNameLength) + " characters, not '.' or '..')");
  r.ReadEnum(root, "kind", "", kJobKindNames, &spec.kind);
  if (spec.kind == JobKind::kGenerate) spec.task = TaskKind::kCausalLm;
  r.ReadEnum(root, "task", "", kTaskNames, &spec.task);
  if (spec.kind == JobKind::kGenerate && spec.task != TaskKind::kCausalLm)
    r.Fail(root["task"], "task", "kind: generate needs task: causal_lm");
  r.ReadInt(root, "seed", "", &spec.seed, 0, std::numeric_limits<int64_t>::max());
  if (root["eval"].IsDefined() && spec.kind != JobKind::kFinetune)
    r.Fail(root["eval"], "eval", "only used by kind: finetune");
  if (spec.kind == JobKind::kServe) {
    ParseServe(r, root, &spec);
    ParseRest(r, root, &spec);
    return spec;
  }
  ParseData(r, root, &spec);
  ParseModel(r, root, &spec);
  const TokenizerSpec& t = spec.data.tokenizer;
  if (t.vocab.empty() && t.model.empty() && !spec.model.init.empty()) TokenizerOfInit(r, root, &spec);
  ParseTrain(r, root, &spec);
  ParseEval(r, root, &spec);
  ParseRest(r, root, &spec);
  if (spec.kind == JobKind::kFinetune) CheckEvaluationNeeds(r, root, spec);
  if (spec.kind == JobKind::kBenchmark) ParseBenchmark(r, root, &spec);
  if (spec.kind == JobKind::kInference) ParseInference(r, root, &spec);
  if (spec.kind == JobKind::kGenerate) ParseGenerate(r, root, &spec);
  for (const char* other : {"benchmark", "inference", "generate", "serve"})
    if (root[other].IsDefined() && std::string(other) != ToString(spec.kind))
      r.Fail(root[other], other, std::string("only used by kind: ") + other);

  return spec;
}

// "file:line:column: " of a yaml-cpp mark; a null mark (-1) reads as the document start.
std::string Located(const std::string& source, const YAML::Mark& mark) {
  return source + ":" + std::to_string(std::max(mark.line, 0) + 1) + ":" +
         std::to_string(std::max(mark.column, 0) + 1) + ": ";
}

}  // namespace

// Every exception of yaml-cpp (parser, depth guard, conversions, subscripts of the wrong
// node kind) becomes a located SpecError here, whichever check it escaped: the reader
// turns the ones it expects into better messages first.
JobSpec ParseJobSpec(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir,
                     const SpecOverrides& overrides) {
  // yaml-cpp parses by recursive descent, a frame or more per level: no text reaches it
  // nested deeper than the budget's 32 levels (the event stream that checks is stopped
  // there). jobctl and the coordinator check a tighter budget of their own first.
  CheckYamlBudget(yaml_text, source_name, kJobFileBudget);
  try {
    YAML::Node root;
    try {
      root = YAML::Load(yaml_text);
    } catch (const YAML::DeepRecursion& e) {
      throw SpecError(Located(source_name, e.mark) + "<document>: malformed YAML: nested deeper than " +
                      std::to_string(e.depth()) + " levels");
    } catch (const YAML::ParserException& e) {
      throw SpecError(Located(source_name, e.mark) + "<document>: malformed YAML: " + e.msg);
    }
    if (!root.IsMap()) throw SpecError(source_name + ":1:1: <document>: expected a mapping of job keys");
    // The file's own values are expanded first; a --set value is taken as given (the
    // shell has expanded it).
    if (overrides.expand_environment) spec_overrides::ExpandEnvironment(root, source_name);
    std::map<std::string, std::string> origins;
    for (const SpecOverrides::Set& set : overrides.sets) spec_overrides::ApplySet(root, set, &origins);
    std::map<std::string, std::string> locations, values;
    SpecReader reader(source_name, fs::path(base_dir), &locations, &values);
    reader.set_origins(&origins);
    JobSpec spec = ParseDocument(reader, root, source_name);
    spec.locations = std::move(locations);
    spec.values = std::move(values);
    spec.base_dir = base_dir;
    YAML::Emitter effective;
    effective << root;
    spec.effective_yaml = std::string(effective.c_str()) + "\n";
    return spec;
  } catch (const YAML::Exception& e) {
    throw SpecError(Located(source_name, e.mark) + "<document>: unusable YAML: " + e.msg);
  }
}

std::string ReadJobFile(const std::string& path) {
  // A FIFO or a device as the job file would block or never end.
  if (std::string problem = PathProblem(path, PathKind::kFile); !problem.empty())
    throw SpecError(path + ":0:0: <file>: " + problem);
  const FileRead read = ReadUserFile(path, kMaxJobFileBytes);  // checked again on the file opened
  switch (read.status) {
    case FileRead::kOk:
      return read.bytes;
    case FileRead::kTooLarge:
      throw SpecError(path + ":0:0: <file>: larger than " + std::to_string(kMaxJobFileBytes >> 20) + " MiB");
    case FileRead::kRefused:
      throw SpecError(path + ":0:0: <file>: a special file (a FIFO, device or folder), not a regular file");
    default:
      throw SpecError(path + ":0:0: <file>: cannot open the job file: " + read.why);
  }
}

JobSpec LoadJobSpec(const std::string& path, const SpecOverrides& overrides) {
  const std::string text = ReadJobFile(path);
  return ParseJobSpec(text, path, fs::absolute(fs::path(path)).parent_path().string(), overrides);
}

std::string JobSpec::Where(const std::string& key_path) const {
  auto it = locations.find(key_path);
  return (it == locations.end() ? source_file : it->second) + ": " + key_path;
}

const std::vector<std::string>& EvalMetricNames(TaskKind task) {
  static const std::vector<std::string> classification = {"accuracy", "f1", "precision", "recall"};
  static const std::vector<std::string> causal_lm = {"accuracy", "perplexity"};
  return task == TaskKind::kCausalLm ? causal_lm : classification;
}

const char* ToString(Precision p) { return NameOf(kPrecisionNames, p); }
const char* ToString(ForwardMode m) { return NameOf(kForwardModeNames, m); }
const char* ToString(JobKind k) { return NameOf(kJobKindNames, k); }

}  // namespace trainyard
