// The Trainer's evaluations: the dev set at epoch ends and every eval.every_steps, the
// test split at the end, the best evaluation's checkpoint (checkpoint.best_metric) and
// early stopping (train.early_stopping). Every rank evaluates its share of a split and
// the sums are all-reduced, so every rank holds the same figures and judges them alike:
// the decisions they drive (a best checkpoint, a stop) need no further agreement.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/log.h"
#include "worker/jobs/trainer.h"
#include "worker/report/eval_metrics.h"
#include "worker/train/device_transfer.h"

namespace trainyard {
namespace {

// "  eval_loss 0.4127  eval_f1 0.8811 ..." for the log.
std::string Figures(const std::vector<std::pair<std::string, double>>& metrics) {
  std::string out;
  for (const auto& [name, value] : metrics) out += StrFormat("  %s %.4f", name.c_str(), value);
  return out;
}

}  // namespace

double Trainer::Evaluation::Get(const std::string& name) const {
  for (const auto& [key, value] : metrics)
    if (key == name) return value;
  return 0.0;
}

Trainer::Evaluation Trainer::Evaluate(const TextDataset& data, TokenCache* tokens, const std::string& split) {
  Evaluation out;
  out.split = split;
  out.step = progress_.global_step;
  out.examples = data.examples.size();
  if (data.examples.empty()) return out;
  const auto start = Clock::now();
  torch::NoGradGuard no_grad;
  model_->eval();
  std::vector<int32_t> order(data.examples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return data.examples[a].text.size() < data.examples[b].text.size(); });
  // Each rank evaluates every world-th batch; the sums are added up across ranks.
  std::vector<BatchIndices> batches;
  const size_t batch_size = static_cast<size_t>(spec_.eval.batch_size);
  for (size_t i = 0, b = 0; i < order.size(); i += batch_size, ++b)
    if (static_cast<int>(b % ranks_.world) == ranks_.rank)
      batches.emplace_back(order.begin() + i, order.begin() + std::min(order.size(), i + batch_size));
  BatchPipeline pipeline(data, *tokenizer_, std::move(batches), BatchOptions(tokens));
  DeviceTransfer transfer(device_);
  // EvaluationSums' figures, kept on the device and read once at the end. A rank without
  // a batch adds zeros of the same length.
  const int64_t width = causal_lm() ? 3 : 3 + 3 * int64_t(labels_.size());
  torch::Tensor sums = torch::zeros({width}, torch::TensorOptions(torch::kDouble).device(device_));
  while (auto host = pipeline.Next()) {
    Batch batch = transfer.ToDevice(std::move(*host));
    sums += graphs_ ? graphs_->Evaluate(batch, [this](Batch& b) { return EvaluationSums(b); }) : EvaluationSums(batch);
  }
  if (ranks_.comm) {
    ranks_.comm->AllReduce(sums, ReduceOp::kSum, split + " evaluation sums");
    // Every rank judges the figures (a best checkpoint, a stop: both collective), so they
    // must agree to the bit, whatever order a reduction added them in on each rank.
    ranks_.comm->Broadcast(sums, 0, split + " evaluation sums, as rank 0 has them");
  }
  model_->train();
  sums = sums.to(torch::kCPU).contiguous();
  out.metrics = ReportedMetrics(std::vector<double>(sums.data_ptr<double>(), sums.data_ptr<double>() + width), split);
  out.accuracy = sums[1].item<double>() / std::max(1.0, sums[2].item<double>());
  out.seconds = MsSince(start) / 1000.0;
  return out;
}

std::vector<std::pair<std::string, double>> Trainer::ReportedMetrics(const std::vector<double>& sums,
                                                                     const std::string& split) const {
  const double counted = std::max(1.0, sums[2]), loss = sums[0] / counted;
  std::vector<std::pair<std::string, double>> all;
  if (causal_lm()) {
    all = {{"accuracy", sums[1] / counted}, {"perplexity", std::exp(loss)}};
  } else {
    const auto classes = static_cast<std::ptrdiff_t>(labels_.size());
    ClassCounts counts;
    counts.correct.assign(sums.begin() + 3, sums.begin() + 3 + classes);
    counts.predicted.assign(sums.begin() + 3 + classes, sums.begin() + 3 + 2 * classes);
    counts.actual.assign(sums.begin() + 3 + 2 * classes, sums.begin() + 3 + 3 * classes);
    all = ClassificationMetrics(counts);
  }
  const std::vector<std::string>& wanted = spec_.eval.metrics;
  std::vector<std::pair<std::string, double>> out = {{split + "_loss", loss}};
  for (const auto& [name, value] : all)
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), name) != wanted.end())
      out.emplace_back(split + "_" + name, value);
  return out;
}

// One evaluation batch's figures, as doubles on the device: the loss sum, correct
// predictions and their count (examples, or predicted tokens for a causal LM); for a
// classifier then per class its correct predictions, its predictions and its examples.
// No host waits: a CUDA graph can hold it.
torch::Tensor Trainer::EvaluationSums(const Batch& batch) {
  AutocastScope autocast(device_.type(), spec_.train.precision);
  torch::Tensor logits = ForwardBatch(*model_, batch);
  torch::Tensor loss = TaskLoss(logits, batch, torch::kSum).to(torch::kDouble);
  if (causal_lm()) {
    torch::Tensor targets = NextTokenTargets(batch);
    torch::Tensor counted = targets.ne(kIgnoredTarget);
    torch::Tensor correct = logits.narrow(1, 0, logits.size(1) - 1).argmax(2).eq(targets).logical_and(counted).sum();
    return torch::stack({loss, correct.to(torch::kDouble), counted.sum().to(torch::kDouble)});
  }
  const torch::Tensor predicted = logits.argmax(1);
  const torch::Tensor hit = predicted.eq(batch.labels).to(torch::kDouble);
  const torch::Tensor one = torch::ones_like(hit);
  auto per_class = [&](const torch::Tensor& index, const torch::Tensor& weight) {
    return torch::zeros({logits.size(1)}, loss.options()).index_add_(0, index, weight);
  };
  return torch::cat({torch::stack({loss, hit.sum(), one.sum()}), per_class(batch.labels, hit),
                     per_class(predicted, one), per_class(batch.labels, one)});
}

Trainer::Evaluation Trainer::EvaluateDev(RunLog* log) {
  if (last_eval_ && last_eval_->step == progress_.global_step) return *last_eval_;
  Evaluation e = Evaluate(dev_, dev_tokens_.get(), "eval");
  if (!dev_.examples.empty() && progress_.evals.step < progress_.global_step) {
    progress_.evals.step = progress_.global_step;
    e.bettered = Judge(e);
    if (log) {
      log->AddEvaluation(EvaluationLine(e));
      LogInfo(StrFormat("step %ld:%s  (%.1f s)%s", long(e.step), Figures(e.metrics).c_str(), e.seconds,
                        e.bettered ? "  (the best so far)" : ""));
    }
  }
  last_eval_ = e;
  return e;
}

bool Trainer::EvaluationDue() const {
  const int64_t every = spec_.eval.every_steps, step = progress_.global_step;
  return every > 0 && step > 0 && step % every == 0 && progress_.evals.step < step;
}

void Trainer::EvaluateAndCheckpointIfDue(RunLog* log, bool checkpoint_due) {
  const bool best = EvaluationDue() && EvaluateDev(log).bettered;
  if (checkpoint_due || best) SaveCheckpointNow(best ? "a new best evaluation" : "every_steps");
}

bool Trainer::Judge(const Evaluation& e) {
  const std::string& metric = spec_.checkpoint.best_metric;
  if (metric.empty()) return false;
  TrainProgress::Evaluations& evals = progress_.evals;
  const double value = e.Get(metric);
  const bool first = evals.best_step == 0;
  const bool better =
      !std::isnan(value) &&
      (first || (spec_.checkpoint.greater_is_better ? value > evals.best_value : value < evals.best_value));
  // HF's EarlyStoppingCallback: a gain is a better value by more than the threshold.
  const bool gain = better && (first || std::abs(value - evals.best_value) > spec_.train.early_stopping.threshold);
  evals.without_gain = gain ? 0 : evals.without_gain + 1;
  if (better) {
    evals.best_value = value;
    evals.best_step = e.step;
  }
  if (StoppedEarly() && is_rank0())
    LogInfo(
        StrFormat("early stopping: %s has not bettered %.6g (step %ld) by more than %g in %ld evaluations; "
                  "the run ends at step %ld",
                  metric.c_str(), evals.best_value, long(evals.best_step), spec_.train.early_stopping.threshold,
                  long(evals.without_gain), long(e.step)));
  return better;
}

bool Trainer::StoppedEarly() const {
  return spec_.train.early_stopping.enabled && progress_.evals.without_gain >= spec_.train.early_stopping.patience;
}

nlohmann::json Trainer::EvaluationLine(const Evaluation& e) const {
  const std::string& split = e.split;
  const double epoch =
      double(progress_.epoch) + (steps_per_epoch_ > 0 ? double(progress_.next_batch) / double(steps_per_epoch_) : 0.0);
  nlohmann::json line = {{"step", e.step}, {"epoch", epoch}, {"split", split}};
  for (const auto& [name, value] : e.metrics) line[name] = value;
  line[split + "_runtime"] = e.seconds;
  line[split + "_samples_per_second"] = double(e.examples) / std::max(1e-9, e.seconds);
  return line;
}

void Trainer::RestoreBestWeights(nlohmann::json* summary) {
  const TrainProgress::Evaluations& evals = progress_.evals;
  if (spec_.checkpoint.best_metric.empty() || evals.best_step == 0) return;
  (*summary)["best"] = {{"metric", spec_.checkpoint.best_metric},
                        {"value", evals.best_value},
                        {"step", evals.best_step},
                        {"weights", "the best evaluation's"}};
  if (StoppedEarly())
    (*summary)["stopped_early"] =
        StrFormat("%s did not better its best by more than %g in %ld evaluations", spec_.checkpoint.best_metric.c_str(),
                  spec_.train.early_stopping.threshold, long(evals.without_gain));
  if (evals.best_step == progress_.global_step) return;
  bool restored = false;
  if (is_rank0()) {
    const std::string path = CheckpointPath(run_dir() + "/checkpoints", evals.best_step);
    try {
      LoadCheckpoint(path, *model_, *optimizer_, *scaler_, ranks_.rank, steps_per_epoch_);
      restored = true;
      LogInfo(StrFormat("the model is the best evaluation's, step %ld (%s %.6g), from %s", long(evals.best_step),
                        spec_.checkpoint.best_metric.c_str(), evals.best_value, path.c_str()));
    } catch (const CheckpointError& e) {
      LogWarn(
          StrFormat("the best evaluation's checkpoint (step %ld) does not load, so the model is the last step's: %s",
                    long(evals.best_step), e.what()));
    }
  }
  if (ranks_.comm) BroadcastParameters();  // rank 0's weights, the best or not, on every rank
  if (!restored) (*summary)["best"]["weights"] = "the last step's: the best evaluation's checkpoint did not load";
}

void Trainer::EvaluateTest(RunLog* log, nlohmann::json* summary) {
  if (test_.examples.empty()) return;
  const Evaluation e = Evaluate(test_, test_tokens_.get(), "test");
  nlohmann::json line = EvaluationLine(e);
  if (log) log->AddEvaluation(line);
  (*summary)["test"] = nlohmann::json::object();
  for (const auto& [name, value] : e.metrics) (*summary)["test"][name] = value;
  if (is_rank0()) LogInfo(StrFormat("test split, %zu examples:%s", e.examples, Figures(e.metrics).c_str()));
}

}  // namespace trainyard
