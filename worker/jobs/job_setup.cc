#include "worker/jobs/job_setup.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/log.h"
#include "common/tokenizer_json.h"
#include "worker/kernels/compute_dtype_weights.h"
#include "worker/kernels/cpu_block_cache.h"
#include "worker/kernels/packed_linear.h"
#include "worker/models/hf_checkpoint.h"
#include "worker/report/mlflow_logger.h"
#include "worker/train/amp.h"

namespace trainyard {

void AgreeOnStop(const RankContext& ranks, const std::function<std::string()>& where) {
  if (!ranks.hooks && !ranks.stop_signal) return;
  bool stop = StopAsked(ranks);
  if (ranks.comm) stop = ranks.comm->AnyTrue(stop, "stop request");
  if (stop) throw JobStopped("stopped on request " + where());
}

int VisibleGpus() {
  // A count, never negative; c10 returns it as a (signed) device index type.
  return static_cast<int>(static_cast<uint8_t>(torch::cuda::device_count()));
}

std::pair<size_t, size_t> RankShard(size_t n, int rank, int world) {
  const size_t r = static_cast<size_t>(rank), w = static_cast<size_t>(world);
  const size_t begin = r * (n / w) + std::min(r, n % w);
  return {begin, begin + n / w + (r < n % w ? 1 : 0)};
}

void WriteJobSummary(const JobSpec& spec, const nlohmann::json& summary) {
  WriteEffectiveJob(spec);
  WriteFileAtomically(RunDir(spec) + "/summary.json", summary.dump(2) + "\n");
}

void WriteEffectiveJob(const JobSpec& spec) {
  if (spec.effective_yaml.empty()) return;  // a spec not read from YAML (tests)
  std::filesystem::create_directories(RunDir(spec));
  WriteFileAtomically(RunDir(spec) + "/job.yaml", spec.effective_yaml);
}

std::string RunDir(const JobSpec& spec) {
  std::filesystem::path root =
      spec.log.runs_dir.empty() ? std::filesystem::path("runs") : std::filesystem::path(spec.log.runs_dir);
  return (root / spec.name).string();
}

PipelineOptions PipelineOptionsFor(const JobSpec& spec, const torch::Device& device) {
  PipelineOptions options;
  options.prefetch_batches = spec.data.prefetch_batches;
  options.threads = spec.data.loader_threads;
  options.pin_memory = device.is_cuda();
  options.max_len = spec.data.max_seq_len;
  options.pad_lengths = PadBucketLengths(spec.data.pad_buckets, spec.data.max_seq_len);
  return options;
}

void CheckRunFolder(const JobSpec& spec) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(RunDir(spec));
  const std::string where = spec.Where("log.runs_dir") + " (or --runs-dir)";
  std::error_code error;
  // A run deletes and replaces files in its folder: through a link, it would do so
  // wherever the link points.
  for (const fs::path& folder : {dir, dir / "checkpoints", dir / "tb"}) {
    const fs::file_status status = fs::symlink_status(folder, error);
    if (fs::is_symlink(status))
      throw InputError(where + ": " + folder.string() +
                       " is a symbolic link; a run folder and its checkpoints/ and tb/ must be real folders");
    if (fs::exists(status) && !fs::is_directory(status))
      throw InputError(where + ": " + folder.string() + " is a file, not a folder");
  }
  // The nearest folder that exists: a file there means the run folder can never be made.
  for (fs::path up = dir.parent_path(); !up.empty() && up != up.root_path(); up = up.parent_path()) {
    const fs::file_status status = fs::status(up, error);
    if (!fs::exists(status)) continue;
    if (!fs::is_directory(status))
      throw InputError(where + ": " + up.string() + " is a file, so the run folder " + dir.string() +
                       " cannot be made beneath it");
    break;
  }
}

torch::Device PrepareRuntime(const JobSpec& spec, const RankContext& ranks) {
  CheckRunFolder(spec);
  if (spec.runtime.threads > 0) torch::set_num_threads(spec.runtime.threads);
  torch::manual_seed(spec.seed);
  at::globalContext().setAllowTF32CuBLAS(spec.runtime.tf32);
  SetCpuGemm(CpuGemmNamed(spec.runtime.cpu_gemm));
  SetWeightCastsOnce(spec.runtime.weight_casts == "once");
  // A pool worker runs many jobs in one process: once installed, a job's 0 keeps nothing.
  if (spec.runtime.cpu_block_cache_mb > 0 || CpuBlockCache::Installed())
    CpuBlockCache::Install(size_t(spec.runtime.cpu_block_cache_mb) << 20);
  if (!spec.log.mlflow_uri.empty() && !MlflowAvailable())
    throw InputError(spec.Where("log.mlflow.uri") + ": this worker was built without libcurl, so it cannot log to " +
                     "MLflow (install libcurl4-openssl-dev and rebuild)");
  const bool cuda = torch::cuda::is_available();
  if (spec.runtime.device == DeviceChoice::kCuda && !cuda)
    throw InputError(spec.Where("runtime.device") + ": 'cuda' asked for, but no CUDA device is visible");
  const bool use_cuda = spec.runtime.device != DeviceChoice::kCpu && cuda;
  if (spec.kind != JobKind::kBenchmark && spec.train.precision == Precision::kFp16 && !use_cuda)
    throw InputError(spec.Where("train.precision") + ": fp16 autocast needs a CUDA device; use bf16 (or fp32) on CPU");
  if (!use_cuda) {
    const auto& asked = spec.benchmark.precisions;
    const bool bf16 = spec.kind == JobKind::kBenchmark
                          ? std::find(asked.begin(), asked.end(), Precision::kBf16) != asked.end()
                          : spec.train.precision == Precision::kBf16;
    if (bf16 && ranks.rank == 0)
      if (std::string caveat = CpuBf16Caveat(); !caveat.empty()) LogWarn(caveat);
    if (ranks.rank == 0)
      LogInfo("CPU products on frozen weights: " + CpuGemmInUseName() + " (runtime.cpu_gemm: " + spec.runtime.cpu_gemm +
              "); freed buffers kept for reuse: up to " + std::to_string(spec.runtime.cpu_block_cache_mb) +
              " MiB (runtime.cpu_block_cache_mb)");
    return torch::Device(torch::kCPU);
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ranks.local_rank % VisibleGpus()));
}

LabelSet LoadLabels(const JobSpec& spec) {
  if (spec.data.labels.empty()) return LabelSet();
  try {
    return LabelSet::FromFile(spec.data.labels);
  } catch (const DatasetError& e) {
    throw InputError(spec.Where("data.labels") + ": " + e.what());
  }
}

TextDataset LoadTexts(const JobSpec& spec, const std::string& key, const std::string& path, LabelSet* labels,
                      bool any_label) {
  TextFormat format{spec.data.format == DataFormat::kJsonl, spec.data.text_field, spec.data.label_field,
                    spec.data.format == DataFormat::kText};
  try {
    if (!any_label) return ReadTextDataset(path, format, labels);
    LabelSet seen;
    TextDataset data = ReadTextDataset(path, format, &seen);
    for (auto& example : data.examples) example.label = labels->IdOf(seen.names()[example.label]);
    return data;
  } catch (const DatasetError& e) {
    throw InputError(spec.Where(key) + ": " + e.what());
  }
}

void SaveTokenizerFiles(const std::string& folder, const TokenizerSpec& tokenizer) {
  namespace fs = std::filesystem;
  fs::create_directories(folder);
  nlohmann::json config;
  auto copy = [&](const std::string& from, const char* name) {
    fs::copy_file(from, fs::path(folder) / name, fs::copy_options::overwrite_existing);
  };
  const auto write = [&](const std::string& text, const char* name) {
    WriteFileAtomically((fs::path(folder) / name).string(), text);
  };
  if (!tokenizer.tokenizer_json.empty()) {
    // The classic files converted from it (what HF's slow tokenizers and our serving
    // read), and the file itself (what HF's fast tokenizers prefer).
    const HfTokenizerFiles files = ReadTokenizerJson(tokenizer.tokenizer_json);
    write(files.vocab, files.model == HfTokenizerFiles::Model::kWordPiece ? "vocab.txt" : "vocab.json");
    if (files.model == HfTokenizerFiles::Model::kByteLevelBpe) write(files.merges, "merges.txt");
    copy(tokenizer.tokenizer_json, "tokenizer.json");
  }
  switch (tokenizer.kind) {
    case TokenizerKind::kWordPiece:
      if (tokenizer.tokenizer_json.empty()) copy(tokenizer.vocab, "vocab.txt");
      config = {{"do_lower_case", tokenizer.lowercase}, {"strip_accents", nullptr}};
      break;
    case TokenizerKind::kByteLevelBpe:
      if (tokenizer.tokenizer_json.empty()) {
        copy(tokenizer.vocab, "vocab.json");
        copy(tokenizer.merges, "merges.txt");
      }
      config = {{"add_prefix_space", tokenizer.add_prefix_space}};
      break;
    case TokenizerKind::kSentencePiece:
      return;  // no Hugging Face tokenizer reads our SentencePiece template
  }
  WriteFileAtomically((fs::path(folder) / "tokenizer_config.json").string(), config.dump(2) + "\n");
}

std::unique_ptr<Tokenizer> LoadTokenizer(const JobSpec& spec, const TextDataset& train) {
  try {
    return MakeTokenizer(spec.data, train);
  } catch (const std::exception& e) {
    // The messages begin with the file at fault; the key is the one that names it.
    const TokenizerSpec& t = spec.data.tokenizer;
    std::string key = "data.tokenizer.vocab";
    if (!t.tokenizer_json.empty()) key = "model.init";
    if (t.kind == TokenizerKind::kSentencePiece) key = "data.tokenizer.model";
    if (t.kind == TokenizerKind::kByteLevelBpe && std::string(e.what()).rfind(t.merges, 0) == 0)
      key = "data.tokenizer.merges";
    throw InputError(spec.Where(key) + ": " + e.what());
  }
}

namespace {

ModelTask TaskOf(const JobSpec& spec) {
  return spec.task == TaskKind::kCausalLm ? ModelTask::kCausalLm : ModelTask::kSequenceClassification;
}

// The positions of the family's released models (BERT's 512, GPT-2's 1024).
int64_t ReleasedPositions(ModelFamily family) { return family == ModelFamily::kGpt2 ? 1024 : 512; }

// The config.json the job's model is built from: model.init's, or the preset's.
nlohmann::json ModelConfig(const JobSpec& spec, const Tokenizer& tokenizer, const std::vector<std::string>& labels,
                           int64_t max_sequence, bool keep_init_labels) {
  const ModelTask task = TaskOf(spec);
  if (spec.model.init.empty()) {
    const ModelFamily family = spec.model.family.empty() ? ModelFamily::kBert : FamilyNamed(spec.model.family);
    PresetArgs args;
    args.vocab_size = tokenizer.vocab_size();
    // A fine-tuned preset has its family's released positions however short the job's
    // texts, so the model it exports can take longer inputs later.
    args.max_sequence =
        spec.kind == JobKind::kFinetune ? std::max(max_sequence, ReleasedPositions(family)) : max_sequence;
    args.pad_id = tokenizer.pad_id();
    args.bos_id = tokenizer.bos_id();
    args.eos_id = tokenizer.eos_id();
    args.labels = labels;
    return PresetConfig(family, task, spec.model.preset, args);
  }
  nlohmann::json config;
  try {
    config = ReadHfConfig(spec.model.init);  // its errors name the file
  } catch (const std::exception& e) {
    throw InputError(spec.Where("model.init") + ": " + e.what());
  }
  try {  // the file as written, before the job's labels and dropout replace its own
    CheckConfig(config);
    const ModelFamily family = FamilyOf(config);
    if (!spec.model.family.empty() && FamilyNamed(spec.model.family) != family)
      throw std::runtime_error("the model is " + std::string(FamilyName(family)) + ", the job file says model.family " +
                               spec.model.family);
  } catch (const std::exception& e) {
    throw InputError(spec.Where("model.init") + ": " + spec.model.init + "/config.json: " + e.what());
  }
  if (!keep_init_labels && task == ModelTask::kSequenceClassification) SetLabels(&config, labels);
  return config;
}

// model.lora's options: the adapter folder's config when one is given, else the job's.
LoraOptions LoraOptionsOf(const JobSpec& spec) {
  const LoraSpec& l = spec.model.lora;
  if (!l.adapter.empty()) {
    try {
      LoraOptions o = ReadAdapterConfig(l.adapter);
      o.dropout = l.dropout;
      return o;
    } catch (const std::exception& e) {
      throw InputError(spec.Where("model.lora.adapter") + ": " + e.what());
    }
  }
  return LoraOptions{l.r, l.alpha, l.dropout, l.target_modules, l.target_regex, l.modules_to_save, l.use_rslora};
}

void AttachLora(const JobSpec& spec, ModelImpl& model, LoraSummary* out) {
  const bool named = !spec.model.lora.target_modules.empty() || !spec.model.lora.target_regex.empty();
  const std::string at = named ? "model.lora.target_modules" : "model.lora";
  LoraSummary summary;
  try {
    summary = ApplyLora(model, LoraOptionsOf(spec));
  } catch (const std::invalid_argument& e) {
    throw InputError(spec.Where(spec.model.lora.adapter.empty() ? at : "model.lora.adapter") + ": " + e.what());
  }
  if (!spec.model.lora.adapter.empty()) {
    try {
      LoadAdapter(spec.model.lora.adapter, model);
    } catch (const std::exception& e) {
      throw InputError(spec.Where("model.lora.adapter") + ": " + e.what());
    }
  }
  if (out) *out = std::move(summary);
}

// model.fused_kernels: auto turns them on where a lent GPU timed them, the training step
// (docs/performance.md); off a GPU the layers run unfused whatever the flag says.
bool WantsFusedKernels(const JobSpec& spec) {
  if (spec.model.fused_kernels != "auto") return spec.model.fused_kernels == "true";
  return spec.kind == JobKind::kFinetune ||
         (spec.kind == JobKind::kBenchmark && spec.benchmark.run == BenchmarkRun::kTrainStep);
}

}  // namespace

Model BuildModel(const JobSpec& spec, const Tokenizer& tokenizer, const std::vector<std::string>& labels,
                 int64_t max_sequence, bool keep_init_labels, LoraSummary* lora) {
  const std::string at = spec.model.init.empty() ? "model.preset" : "model.init";
  nlohmann::json config = ModelConfig(spec, tokenizer, labels, max_sequence, keep_init_labels);
  SetDropout(&config, spec.model.dropout);
  Model model;
  try {
    model = CreateModel(config, TaskOf(spec));
  } catch (const std::exception& e) {
    const std::string file = spec.model.init.empty() ? "" : spec.model.init + "/config.json: ";
    throw InputError(spec.Where(at) + ": " + file + e.what());
  }
  const ModelInfo& info = model->info();
  if (info.vocab_size < tokenizer.vocab_size())
    throw InputError(spec.Where(at) + ": the model's vocab_size " + std::to_string(info.vocab_size) +
                     " is smaller than the tokenizer's " + std::to_string(tokenizer.vocab_size()));
  if (spec.kind == JobKind::kFinetune && info.max_sequence < spec.data.max_seq_len)
    throw InputError(spec.Where("data.max_seq_len") + ": exceeds the model's " + std::to_string(info.max_sequence) +
                     " positions");
  if (info.task == ModelTask::kSequenceClassification && info.labels.empty())
    throw InputError(spec.Where("data.labels") + ": no labels for the classifier");
  if (!spec.model.init.empty()) {
    try {
      for (const auto& name : LoadHfWeights(spec.model.init, *model))
        LogInfo("model.init: '" + name + "' starts from a fresh initialisation");
    } catch (const std::exception& e) {
      throw InputError(spec.Where("model.init") + ": " + e.what());
    }
  }
  if (spec.model.lora.enabled) AttachLora(spec, *model, lora);
  model->set_unpadding(UnpaddingNamed(spec.model.unpad));
  if (WantsFusedKernels(spec) && model->set_fused_add_norm(true) == 0 && spec.model.fused_kernels == "true")
    throw InputError(spec.Where("model.fused_kernels") + ": the " + FamilyName(info.family) +
                     " family has no fused kernels (BERT and RoBERTa have)");
  return model;
}

}  // namespace trainyard
