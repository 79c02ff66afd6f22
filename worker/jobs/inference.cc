#include "worker/jobs/inference.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/jobs/forward_modes.h"
#include "worker/models/config_fields.h"
#include "worker/models/hf_checkpoint.h"
#include "worker/report/run_log.h"
#include "worker/train/amp.h"
#include "worker/train/batch_pipeline.h"
#include "worker/train/device_transfer.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

}  // namespace

InferenceRunner::InferenceRunner(JobSpec spec, RankContext ranks)
    : spec_(std::move(spec)), ranks_(ranks), device_(PrepareRuntime(spec_, ranks_)) {
  labels_ = LoadLabels(spec_);
  if (labels_.size() == 0 && !spec_.model.init.empty()) {
    try {  // the model's own id2label, when the job names no labels file
      labels_ = LabelSet(LabelsField(ReadHfConfig(spec_.model.init)));
    } catch (const std::exception& e) {
      throw InputError(spec_.Where("model.init") + ": " + e.what());
    }
  }
  // Gold labels the model does not know are kept as "unknown" (no accuracy for them).
  input_ = LoadTexts(spec_, "inference.input", spec_.inference.input, &labels_, /*any_label=*/labels_.size() > 0);
  tokenizer_ = LoadTokenizer(spec_, input_);
  model_ = BuildModel(spec_, *tokenizer_, labels_.names(), 512, /*keep_init_labels=*/true);
  labels_ = LabelSet(model_->info().labels);
  model_->to(device_);
  model_->eval();
  Freeze(*model_);
  if (spec_.inference.mode == ForwardMode::kAoti) {
    aoti_ = OpenAotiPackage(spec_, "inference.aoti", spec_.inference.aoti, device_);
    if (spec_.train.precision != Precision::kFp32)
      throw InputError(spec_.Where("inference.mode") +
                       ": an aoti package runs in the precision it was exported in; "
                       "train.precision must be fp32");
    if (spec_.inference.batch_size > aoti_->max_batch() || spec_.data.max_seq_len > aoti_->max_seq())
      throw InputError(spec_.Where("inference.batch_size") + ": batches of " +
                       std::to_string(spec_.inference.batch_size) + " x data.max_seq_len " +
                       std::to_string(spec_.data.max_seq_len) + " do not fit the package (" + aoti_->Describe() +
                       "); export it with larger --max-batch/--max-seq or lower these");
  }
  if (spec_.inference.mode == ForwardMode::kInt8) {
    if (device_.is_cpu() && spec_.train.precision != Precision::kFp32)  // elsewhere the device is refused below
      throw InputError(spec_.Where("inference.mode") + ": int8 takes fp32 activations; train.precision is " +
                       ToString(spec_.train.precision));
    QuantizeForInt8(spec_, "inference.mode", *model_, device_);
  }
  if (spec_.model.init.empty())
    LogWarn("inference with a freshly initialised '" + spec_.model.preset +
            "' model (no model.init): predictions are meaningless, timings are real");
  std::tie(shard_begin_, shard_end_) = RankShard(input_.examples.size(), ranks_.rank, ranks_.world);
}

std::string InferenceRunner::run_dir() const { return RunDir(spec_); }

InferenceRunner::Pass InferenceRunner::Predict(bool sort_by_length) {
  std::vector<int32_t> order(shard_end_ - shard_begin_);
  std::iota(order.begin(), order.end(), static_cast<int32_t>(shard_begin_));
  if (sort_by_length)
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return input_.examples[a].text.size() < input_.examples[b].text.size();
    });
  std::vector<BatchIndices> batches;
  const size_t batch_size = spec_.inference.batch_size;
  for (size_t i = 0; i < order.size(); i += batch_size)
    batches.emplace_back(order.begin() + i, order.begin() + std::min(order.size(), i + batch_size));
  PipelineOptions options = PipelineOptionsFor(spec_, device_);
  std::vector<BatchIndices> plan = batches;
  Pass pass;
  pass.logits = torch::zeros({int64_t(order.size()), int64_t(labels_.size())}, torch::kFloat);
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  BatchPipeline pipeline(input_, *tokenizer_, std::move(plan), options);
  DeviceTransfer transfer(device_);
  // Rank 0's shard stands for all: the ranks' shards are the same size to within a text.
  ProgressLine line(sort_by_length ? "inference (sorted by length)" : "inference (file order)", int64_t(batches.size()),
                    spec_.log.progress && ranks_.rank == 0);
  size_t texts = 0;
  for (size_t b = 0; !StopAsked(ranks_); ++b) {
    auto host = pipeline.Next();
    if (!host) break;
    pass.tokens += host->real_tokens;
    pass.padded_tokens += host->input_ids.numel();
    Batch batch = transfer.ToDevice(std::move(*host));
    torch::Tensor logits;
    {
      AutocastScope autocast(device_.type(), spec_.train.precision);
      logits = (aoti_ ? aoti_->Forward(batch.input_ids, batch.attention_mask)
                      : model_->forward(batch.input_ids, batch.attention_mask))
                   .to(torch::kFloat)
                   .cpu();
    }
    torch::Tensor rows =
        torch::tensor(std::vector<int64_t>(batches[b].begin(), batches[b].end())) - int64_t(shard_begin_);
    pass.logits.index_copy_(0, rows, logits);
    texts += batches[b].size();
    line.Update(int64_t(b + 1), StrFormat("%.0f texts/s", double(texts) / std::max(1e-9, SecondsSince(start))));
  }
  pass.seconds = SecondsSince(start);
  line.Finish();
  return pass;
}

torch::Tensor InferenceRunner::GatherLogits(const torch::Tensor& mine) const {
  if (!ranks_.comm) return mine;
  torch::Tensor all = torch::zeros({int64_t(input_.examples.size()), mine.size(1)}, torch::kFloat);
  all.narrow(0, int64_t(shard_begin_), mine.size(0)).copy_(mine);
  ranks_.comm->AllReduce(all, ReduceOp::kSum, "inference logits");
  return all;
}

void InferenceRunner::WritePredictions(const torch::Tensor& logits) const {
  const std::string path = spec_.inference.output.empty() ? run_dir() + "/predictions.tsv" : spec_.inference.output;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  std::string text = "index\tpredicted\tgold";
  for (const auto& name : labels_.names()) text += "\tlogit_" + name;
  text += "\n";
  torch::Tensor predicted = logits.argmax(1);
  auto acc = logits.accessor<float, 2>();
  for (int64_t i = 0; i < logits.size(0); ++i) {
    const int gold = input_.examples[i].label;
    text += std::to_string(i) + "\t" + labels_.names()[predicted[i].item<int64_t>()] + "\t" +
            (gold >= 0 && gold < int(labels_.size()) ? labels_.names()[gold] : "");
    for (int64_t k = 0; k < logits.size(1); ++k) text += StrFormat("\t%.6g", acc[i][k]);
    text += "\n";
  }
  WriteFileAtomically(path, text);
}

nlohmann::json InferenceRunner::Run() {
  const std::string mode = spec_.inference.sort_by_length;
  std::vector<std::pair<std::string, Pass>> passes;
  if (mode == "false" || mode == "both") passes.emplace_back("file order", Predict(false));
  if (mode == "true" || mode == "both") passes.emplace_back("sorted by length", Predict(true));
  AgreeOnStop(ranks_, [] { return std::string("during batch prediction"); });
  nlohmann::json summary = {{"job", spec_.name},
                            {"kind", "inference"},
                            {"texts", input_.examples.size()},
                            {"batch_size", spec_.inference.batch_size},
                            {"ranks", ranks_.world}};
  std::vector<torch::Tensor> gathered;
  for (auto& [name, pass] : passes) {
    double seconds = pass.seconds;
    if (ranks_.comm) seconds = ranks_.comm->AllGather({seconds}, "inference time")[0][0];
    gathered.push_back(GatherLogits(pass.logits));
    const double texts_per_s = double(input_.examples.size()) / std::max(1e-9, seconds);
    summary["passes"][name] = {
        {"seconds", seconds},
        {"texts_per_s", texts_per_s},
        {"padding_pct", 100.0 * (1.0 - double(pass.tokens) / std::max<int64_t>(1, pass.padded_tokens))}};
    if (ranks_.rank == 0)
      LogInfo(StrFormat("%-16s %8.2f s  %9.1f texts/s  %5.1f%% of tokens are padding (rank 0 shard)", name.c_str(),
                        seconds, texts_per_s, summary["passes"][name]["padding_pct"].get<double>()));
  }
  if (passes.size() == 2) {
    const bool same = gathered[0].argmax(1).equal(gathered[1].argmax(1));
    const double diff = (gathered[0] - gathered[1]).abs().max().item<double>();
    summary["orders_agree"] = same;
    summary["max_logit_diff"] = diff;
    summary["sorted_speedup"] = summary["passes"]["file order"]["seconds"].get<double>() /
                                summary["passes"]["sorted by length"]["seconds"].get<double>();
    if (ranks_.rank == 0)
      LogInfo(StrFormat("sorted by length: %.2fx the throughput of file order; predictions %s (max logit diff %.2e)",
                        summary["sorted_speedup"].get<double>(), same ? "identical" : "DIFFER", diff));
    if (!same) throw std::runtime_error("sorted and file-order predictions differ");
  }
  if (ranks_.rank != 0) return summary;
  WritePredictions(gathered.back());
  int64_t known = 0, correct = 0;
  torch::Tensor predicted = gathered.back().argmax(1);
  for (size_t i = 0; i < input_.examples.size(); ++i) {
    const int gold = input_.examples[i].label;
    if (gold < 0) continue;
    ++known;
    correct += predicted[int64_t(i)].item<int64_t>() == gold;
  }
  if (known > 0) summary["accuracy"] = double(correct) / double(known);
  summary["status"] = "succeeded";
  WriteJobSummary(spec_, summary);
  LogInfo(StrFormat(
      "%zu predictions -> %s%s", input_.examples.size(),
      (spec_.inference.output.empty() ? run_dir() + "/predictions.tsv" : spec_.inference.output).c_str(),
      known > 0 ? StrFormat(" (accuracy %.4f on %ld labelled texts)", double(correct) / known, long(known)).c_str()
                : ""));
  return summary;
}

}  // namespace trainyard
