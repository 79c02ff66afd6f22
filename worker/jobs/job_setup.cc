#include "worker/jobs/job_setup.h"

#include <filesystem>

#include "common/log.h"
#include "worker/models/hf_checkpoint.h"

namespace trainyard {

void AgreeOnStop(const RankContext& ranks, const std::function<std::string()>& where) {
  if (!ranks.hooks) return;
  bool stop = ranks.hooks->StopRequested();
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
  return options;
}

torch::Device PrepareRuntime(const JobSpec& spec, const RankContext& ranks) {
  if (spec.runtime.threads > 0) torch::set_num_threads(spec.runtime.threads);
  torch::manual_seed(spec.seed);
  at::globalContext().setAllowTF32CuBLAS(spec.runtime.tf32);
  const bool cuda = torch::cuda::is_available();
  if (spec.runtime.device == DeviceChoice::kCuda && !cuda)
    throw InputError(spec.Where("runtime.device") + ": 'cuda' asked for, but no CUDA device is visible");
  const bool use_cuda = spec.runtime.device != DeviceChoice::kCpu && cuda;
  if (spec.kind != JobKind::kBenchmark && spec.train.precision == Precision::kFp16 && !use_cuda)
    throw InputError(spec.Where("train.precision") + ": fp16 autocast needs a CUDA device; use bf16 (or fp32) on CPU");
  if (!use_cuda) return torch::Device(torch::kCPU);
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
  TextFormat format{spec.data.format == DataFormat::kJsonl, spec.data.text_field, spec.data.label_field};
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

std::unique_ptr<Tokenizer> LoadTokenizer(const JobSpec& spec, const TextDataset& train) {
  try {
    return MakeTokenizer(spec.data, train);
  } catch (const std::exception& e) {
    const bool wordpiece = spec.data.tokenizer.kind == TokenizerKind::kWordPiece;
    throw InputError(spec.Where(wordpiece ? "data.tokenizer.vocab" : "data.tokenizer.model") + ": " + e.what());
  }
}

BertForSequenceClassification BuildModel(const JobSpec& spec, const Tokenizer& tokenizer,
                                         const std::vector<std::string>& labels, int64_t max_positions,
                                         bool keep_init_labels) {
  BertConfig config;
  if (spec.model.init.empty()) {
    config = BertConfig::Preset(spec.model.preset, tokenizer.vocab_size(), labels, max_positions);
  } else {
    try {
      config = ReadHfConfig(spec.model.init);
    } catch (const std::exception& e) {
      throw InputError(spec.Where("model.init") + ": " + e.what());
    }
    if (!keep_init_labels || config.labels.empty()) config.labels = labels;
  }
  config.hidden_dropout_prob = config.attention_probs_dropout_prob = spec.model.dropout;
  if (config.vocab_size < tokenizer.vocab_size())
    throw InputError(spec.Where("model.init") + ": the model's vocab_size " + std::to_string(config.vocab_size) +
                     " is smaller than the tokenizer's " + std::to_string(tokenizer.vocab_size()));
  if (spec.kind == JobKind::kFinetune && config.max_position_embeddings < spec.data.max_seq_len)
    throw InputError(spec.Where("data.max_seq_len") + ": exceeds the model's max_position_embeddings " +
                     std::to_string(config.max_position_embeddings));
  if (config.labels.empty()) throw InputError(spec.Where("data.labels") + ": no labels for the classifier");
  BertForSequenceClassification model(config);
  if (!spec.model.init.empty()) {
    try {
      for (const auto& name : LoadHfWeights(spec.model.init, model))
        LogInfo("model.init: '" + name + "' starts from a fresh initialisation");
    } catch (const std::exception& e) {
      throw InputError(spec.Where("model.init") + ": " + e.what());
    }
  }
  return model;
}

}  // namespace trainyard
