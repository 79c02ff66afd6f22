#include "worker/trainer.h"

#include <filesystem>
#include <limits>
#include <numeric>

#include "worker/batch_pipeline.h"
#include "worker/device_transfer.h"
#include "worker/log.h"
#include "worker/models/hf_checkpoint.h"
#include "worker/models/safetensors.h"

#ifdef TRAINYARD_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::vector<int32_t> LengthProxies(const TextDataset& data) {
  std::vector<int32_t> lengths;
  lengths.reserve(data.examples.size());
  for (const auto& e : data.examples) lengths.push_back(static_cast<int32_t>(e.text.size()));
  return lengths;
}

}  // namespace

struct Trainer::StepTimes {
  double wait = 0, h2d = 0, forward = 0, backward = 0, comm = 0, optimizer = 0;
  double loss = 0;
  bool skipped = false;
};

// Sums over the steps of the epoch in progress in this process (timings are not
// carried across a resume; losses are, through TrainProgress).
struct Trainer::EpochTotals {
  StepTimes sum;
  int64_t steps = 0, samples = 0;
  Clock::time_point start = Clock::now();
};

Trainer::Trainer(JobSpec spec, RankContext ranks)
    : spec_(std::move(spec)), ranks_(ranks), totals_(std::make_unique<EpochTotals>()) {
  if (spec_.runtime.threads > 0) torch::set_num_threads(spec_.runtime.threads);
  torch::manual_seed(spec_.seed);
  LoadData();
  BuildModel();
  ResolveResume();
}

Trainer::~Trainer() = default;

std::string Trainer::run_dir() const { return RunDir(spec_); }

void Trainer::LoadData() {
  device_ = ChooseDevice(spec_, ranks_.local_rank);
  if (spec_.train.precision == Precision::kFp16 && !device_.is_cuda())
    throw InputError(spec_.Where("train.precision") +
                     ": fp16 autocast needs a CUDA device; use bf16 (or fp32) on CPU");
  labels_ = LoadLabels(spec_);
  train_ = LoadTexts(spec_, "data.train", spec_.data.train, &labels_);
  if (!spec_.data.dev.empty()) dev_ = LoadTexts(spec_, "data.dev", spec_.data.dev, &labels_);
  tokenizer_ = LoadTokenizer(spec_, train_);
  // The plan is made of global batches (batch_size per rank x ranks), so any number of
  // ranks sees the same global order of samples; each rank takes its shard of each.
  sampler_ = std::make_unique<LengthBucketSampler>(
      LengthProxies(train_), spec_.train.batch_size * ranks_.world, spec_.data.bucket_batches, spec_.seed);
  steps_per_epoch_ = static_cast<int64_t>(sampler_->EpochPlan(0).size());
}

void Trainer::BuildModel() {
  model_ = trainyard::BuildModel(spec_, *tokenizer_, labels_.names(), spec_.data.max_seq_len);
  model_->to(device_);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : model_->named_parameters()) {
    named.emplace_back(item.key(), item.value());
    params_.push_back(item.value());
  }
  const TrainSpec& t = spec_.train;
  optimizer_ = std::make_unique<AdamW>(named, AdamWOptions{t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay});
  scaler_ = std::make_unique<GradScaler>(t.loss_scale,
                                         t.precision == Precision::kFp16 || spec_.debug.force_loss_scaling);
  if (ranks_.comm) {
    ReducerOptions options;
    options.bucket_bytes = static_cast<int64_t>(spec_.distributed.bucket_mb * 1048576.0);
    options.overlap = spec_.distributed.overlap;
    options.fp16_compression = spec_.distributed.fp16_compression;
    reducer_ = std::make_unique<Reducer>(named, *ranks_.comm, options);
  }
}

void Trainer::BroadcastParameters() {
  torch::NoGradGuard no_grad;
  for (auto& item : model_->named_parameters()) ranks_.comm->Broadcast(item.value(), 0, "broadcast " + item.key());
  for (auto& item : model_->named_buffers()) ranks_.comm->Broadcast(item.value(), 0, "broadcast " + item.key());
}

void Trainer::AgreeOnResumePoint() {
  auto steps = ranks_.comm->AllGather({double(progress_.global_step)}, "resume point");
  for (int r = 0; r < ranks_.world; ++r)
    if (steps[r][0] != steps[0][0])
      throw std::runtime_error(StrFormat("ranks disagree on the resume point: rank 0 at step %.0f, rank %d at %.0f",
                                         steps[0][0], r, steps[r][0]));
}

void Trainer::ResolveResume() {
  const std::string& resume = spec_.checkpoint.resume;
  if (resume == "none") return;
  if (resume == "auto") {
    std::vector<std::string> rejected;
    resume_from_ = LatestValidCheckpoint(run_dir() + "/checkpoints", &rejected);
    for (const auto& why : rejected) LogWarn("resume: skipping invalid checkpoint " + why);
  } else {
    resume_from_ = resume;
  }
  if (!resume_from_) return;
  try {
    progress_ = LoadCheckpoint(*resume_from_, model_, *optimizer_, *scaler_);
  } catch (const CheckpointError& e) {
    throw InputError(spec_.Where("checkpoint.resume") + ": " + e.what());
  }
}

void Trainer::Synchronize() const {
#ifdef TRAINYARD_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::device_synchronize();
#endif
}

double Trainer::LrAt(int64_t step, int64_t total_steps) const {
  const auto warmup = static_cast<int64_t>(spec_.train.warmup_ratio * double(total_steps));
  return LinearWarmupDecay(spec_.train.lr, step, warmup, total_steps);
}

void Trainer::TrainStep(Batch& batch, double loss_weight, double lr, StepTimes* times) {
  auto start = Clock::now();
  if (reducer_) reducer_->PrepareForBackward();
  torch::Tensor loss;
  if (batch.size() > 0) {
    {
      AutocastScope autocast(device_.type(), spec_.train.precision);
      torch::Tensor logits = model_->forward(batch.input_ids, batch.attention_mask);
      loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.labels);
    }
    Synchronize();
    times->forward = MsSince(start);
    start = Clock::now();
    // loss_weight makes the average over ranks the mean over the global batch, also
    // when the ranks' shards differ in size.
    scaler_->Scale(loss * loss_weight).backward();
  } else {
    loss = torch::zeros({}, torch::kFloat);
    reducer_->ContributeZeros();
  }
  Synchronize();
  times->backward = MsSince(start);
  if (reducer_) times->comm = reducer_->FinishBackward();
  start = Clock::now();
  if (progress_.global_step + 1 == spec_.debug.plant_inf_step && ranks_.rank == spec_.debug.plant_inf_rank) {
    torch::NoGradGuard no_grad;
    params_.front().mutable_grad().view({-1})[0] = std::numeric_limits<float>::infinity();
    LogWarn(StrFormat("debug: planted an inf in rank %d's gradients at step %ld", ranks_.rank,
                      long(progress_.global_step + 1)));
  }
  times->skipped = AgreeOnFoundInf(scaler_->UnscaleAndCheck(params_));
  if (!times->skipped) {
    if (spec_.train.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params_, spec_.train.max_grad_norm);
    optimizer_->Step(lr);
  }
  scaler_->Update(times->skipped);
  optimizer_->ZeroGrad();
  times->loss = loss.item<double>();
  times->optimizer = MsSince(start);
  if (spec_.distributed.check_consistency && ranks_.comm) CheckConsistency();
}

bool Trainer::AgreeOnFoundInf(bool local_found_inf) {
  if (!scaler_->enabled() || !ranks_.comm) return local_found_inf;
  // Every rank must step or skip together, or their weights and scales drift apart.
  return ranks_.comm->AnyTrue(local_found_inf, StrFormat("found_inf of step %ld", long(progress_.global_step + 1)));
}

void Trainer::CheckConsistency() {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a over every parameter's bytes
  for (const auto& p : params_) {
    torch::Tensor cpu = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const uint8_t*>(cpu.data_ptr());
    for (size_t i = 0, n = cpu.numel() * cpu.element_size(); i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  }
  auto all = ranks_.comm->AllGather({double(hash >> 32), double(hash & 0xFFFFFFFFULL)},
                                    StrFormat("consistency check of step %ld", long(progress_.global_step + 1)));
  for (int r = 1; r < ranks_.world; ++r)
    if (all[r] != all[0])
      throw std::runtime_error(StrFormat("parameters diverged after step %ld: rank %d differs from rank 0",
                                         long(progress_.global_step + 1), r));
  ++consistency_checks_;
}


void Trainer::SaveCheckpointNow(const std::string& reason) {
  const std::string dir = run_dir() + "/checkpoints";
  SaveCheckpoint(CheckpointPath(dir, progress_.global_step), model_, *optimizer_, *scaler_, progress_);
  PruneCheckpoints(dir, spec_.checkpoint.keep);
  LogDebug(StrFormat("checkpoint at step %ld (%s)", long(progress_.global_step), reason.c_str()));
}

std::vector<BatchIndices> Trainer::RankShards(std::vector<BatchIndices> global,
                                              std::vector<double>* weights) const {
  // A global batch is split as evenly as possible; with fewer examples than ranks a
  // rank gets none and contributes zero gradients. Nothing is dropped or padded.
  std::vector<BatchIndices> local;
  for (const BatchIndices& batch : global) {
    const size_t n = batch.size(), world = ranks_.world, r = ranks_.rank;
    const size_t begin = r * (n / world) + std::min(r, n % world);
    const size_t count = n / world + (r < n % world ? 1 : 0);
    local.emplace_back(batch.begin() + begin, batch.begin() + begin + count);
    weights->push_back(double(count) * double(world) / double(n));
  }
  return local;
}

void Trainer::TrainEpoch(int64_t epoch, int64_t total_steps, RunLog* log) {
  std::vector<BatchIndices> plan = sampler_->EpochPlan(epoch);
  plan.erase(plan.begin(), plan.begin() + std::min<int64_t>(progress_.next_batch, plan.size()));
  std::vector<double> loss_weights;
  plan = RankShards(std::move(plan), &loss_weights);
  PipelineOptions options = PipelineOptionsFor(spec_, device_);
  BatchPipeline pipeline(train_, *tokenizer_, std::move(plan), options);
  DeviceTransfer transfer(device_);
  ProgressLine progress_line(StrFormat("epoch %ld", long(epoch + 1)), steps_per_epoch_,
                             spec_.log.progress && is_rank0());
  size_t step_in_call = 0;
  model_->train();
  *totals_ = EpochTotals{};
  while (progress_.global_step < total_steps) {
    // Every step in a pool: ranks stop together, before the next collective.
    AgreeOnStop(ranks_, [&] {
      return StrFormat("at step %ld of epoch %ld", long(progress_.global_step), long(progress_.epoch + 1));
    });
    StepTimes times;
    auto start = Clock::now();
    std::optional<Batch> host = pipeline.Next();
    if (!host) break;
    times.wait = MsSince(start);
    start = Clock::now();
    Batch batch = transfer.ToDevice(std::move(*host));
    Synchronize();
    times.h2d = MsSince(start);
    const double lr = LrAt(progress_.global_step, total_steps);
    TrainStep(batch, loss_weights[step_in_call++], lr, &times);

    ++progress_.global_step;
    ++progress_.next_batch;
    ++progress_.epoch_steps;
    progress_.epoch_skipped += times.skipped;
    progress_.epoch_loss_sum += times.loss * double(batch.size());
    progress_.epoch_examples += batch.size();
    EpochTotals& t = *totals_;
    t.sum.wait += times.wait, t.sum.h2d += times.h2d, t.sum.forward += times.forward;
    t.sum.backward += times.backward, t.sum.comm += times.comm, t.sum.optimizer += times.optimizer;
    ++t.steps;
    t.samples += batch.size();

    const double step_ms = times.wait + times.h2d + times.forward + times.backward + times.comm + times.optimizer;
    progress_line.Update(progress_.next_batch,
                         StrFormat("loss %.4f  %.1f ms/step  wait %.1f%%",
                                   progress_.epoch_loss_sum / double(progress_.epoch_examples),
                                   MsSince(t.start) / double(t.steps),
                                   100.0 * t.sum.wait / std::max(1e-9, MsSince(t.start))));
    if (log && progress_.global_step % spec_.log.steps_every == 0)
      log->AddStep({{"step", progress_.global_step}, {"epoch", epoch + 1}, {"loss", times.loss},
                   {"lr", lr}, {"ms", step_ms}, {"wait_ms", times.wait}, {"skipped", times.skipped},
                   {"loss_scale", scaler_->scale()}, {"tokens", batch.real_tokens}, {"comm_ms", times.comm}});
    if (is_rank0() && spec_.checkpoint.every_steps > 0 && progress_.global_step % spec_.checkpoint.every_steps == 0)
      SaveCheckpointNow("every_steps");
  }
  progress_line.Finish();
}

std::pair<double, double> Trainer::Evaluate() {
  if (dev_.examples.empty()) return {0.0, 0.0};
  torch::NoGradGuard no_grad;
  model_->eval();
  std::vector<int32_t> order(dev_.examples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return dev_.examples[a].text.size() < dev_.examples[b].text.size();
  });
  // Each rank evaluates every world-th batch; the sums are added up across ranks.
  std::vector<BatchIndices> batches;
  const size_t batch_size = static_cast<size_t>(spec_.train.batch_size) * 2;
  for (size_t i = 0, b = 0; i < order.size(); i += batch_size, ++b)
    if (static_cast<int>(b % ranks_.world) == ranks_.rank)
      batches.emplace_back(order.begin() + i, order.begin() + std::min(order.size(), i + batch_size));
  PipelineOptions options = PipelineOptionsFor(spec_, device_);
  BatchPipeline pipeline(dev_, *tokenizer_, std::move(batches), options);
  DeviceTransfer transfer(device_);
  torch::Tensor sums = torch::zeros({2}, torch::kDouble);  // loss sum, correct
  while (auto host = pipeline.Next()) {
    Batch batch = transfer.ToDevice(std::move(*host));
    AutocastScope autocast(device_.type(), spec_.train.precision);
    torch::Tensor logits = model_->forward(batch.input_ids, batch.attention_mask).to(torch::kFloat);
    sums[0] += torch::nn::functional::cross_entropy(
                   logits, batch.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    sums[1] += logits.argmax(1).eq(batch.labels).sum().item<int64_t>();
  }
  if (ranks_.comm) ranks_.comm->AllReduce(sums, ReduceOp::kSum, "evaluation sums");
  model_->train();
  const double n = double(dev_.examples.size());
  return {sums[0].item<double>() / n, sums[1].item<double>() / n};
}

EpochRow Trainer::MakeEpochRow(int64_t epoch, double eval_loss, double eval_acc, int64_t total_steps) {
  const EpochTotals& t = *totals_;
  const double elapsed_ms = MsSince(t.start);
  const double steps = std::max<int64_t>(1, t.steps);
  const std::vector<double> mine = {t.sum.wait / steps,     t.sum.h2d / steps, t.sum.forward / steps,
                                    t.sum.backward / steps, t.sum.comm / steps, t.sum.optimizer / steps,
                                    double(t.samples)};
  std::vector<std::vector<double>> all = {mine};
  if (ranks_.comm) all = ranks_.comm->AllGather(mine, StrFormat("step breakdown of epoch %ld", long(epoch + 1)));
  EpochRow row;
  row.epoch = epoch + 1;
  row.ranks = ranks_.world;
  row.global_batch = int64_t(spec_.train.batch_size) * ranks_.world;
  row.time_s = elapsed_ms / 1000.0;
  row.steps = progress_.epoch_steps;
  row.skipped_steps = progress_.epoch_skipped;
  row.wait_ms = mine[0], row.h2d_ms = mine[1], row.forward_ms = mine[2], row.backward_ms = mine[3];
  row.comm_ms = mine[4], row.optimizer_ms = mine[5];
  row.ms_per_step = mine[0] + mine[1] + mine[2] + mine[3] + mine[4] + mine[5];
  double samples = 0;
  for (int part = 0; part < kNumStepParts; ++part) {
    std::vector<double> values;
    for (const auto& r : all) values.push_back(r[part]);
    std::sort(values.begin(), values.end());
    row.parts[part] = {values.front(), values[values.size() / 2], values.back()};
  }
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const double total = std::accumulate(all[r].begin(), all[r].begin() + kNumStepParts, 0.0);
    samples += all[r][kNumStepParts];
    if (total > row.slowest_ms_per_step) row.slowest_ms_per_step = total, row.slowest_rank = r;
  }
  row.samples_per_s = samples / std::max(1e-9, elapsed_ms / 1000.0);
  row.data_wait_pct = 100.0 * mine[0] / std::max(1e-9, row.ms_per_step);
  row.train_loss = progress_.epoch_loss_sum / double(std::max<int64_t>(1, progress_.epoch_examples));
  row.eval_loss = eval_loss;
  row.eval_acc = eval_acc;
  row.lr = LrAt(std::max<int64_t>(0, progress_.global_step - 1), total_steps);
  if (scaler_->enabled()) row.loss_scale = scaler_->scale();
  return row;
}

nlohmann::json Trainer::Run() {
  const auto run_start = Clock::now();
  if (ranks_.comm) {
    BroadcastParameters();
    AgreeOnResumePoint();
  }
  int64_t total_steps = steps_per_epoch_ * spec_.train.epochs;
  if (spec_.train.max_steps > 0) total_steps = std::min(total_steps, spec_.train.max_steps);
  const bool resumed = resume_from_.has_value();
  std::optional<RunLog> log;
  if (is_rank0()) {
    // A fresh run must not leave an older run's checkpoints next to its own: they would
    // outrank the new ones in pruning and in `resume: auto`.
    if (!resumed) fs::remove_all(run_dir() + "/checkpoints");
    log.emplace(run_dir(), resumed ? progress_.epoch + 1 : 0, progress_.global_step);
    LogInfo(StrFormat("job '%s': %zu train / %zu dev examples, %zu labels, vocab %d, %ld steps/epoch, "
                      "batch %d per rank x %d ranks = %d global, %s on %s, %d threads per rank",
                      spec_.name.c_str(), train_.examples.size(), dev_.examples.size(), labels_.size(),
                      tokenizer_->vocab_size(), long(steps_per_epoch_), spec_.train.batch_size, ranks_.world,
                      spec_.train.batch_size * ranks_.world, ToString(spec_.train.precision),
                      device_.str().c_str(), torch::get_num_threads()));
    if (reducer_)
      LogInfo(StrFormat("gradient all-reduce over %s: %zu buckets (%s), overlap %s, compression %s",
                        ranks_.comm->backend().c_str(), reducer_->num_buckets(), reducer_->Describe().c_str(),
                        spec_.distributed.overlap ? "on" : "off",
                        spec_.distributed.fp16_compression ? "fp16" : "none"));
    if (resumed)
      LogInfo(StrFormat("resuming from %s (epoch %ld, step %ld)", resume_from_->c_str(),
                        long(progress_.epoch + 1), long(progress_.global_step)));
    log->PrintHeader();
    for (const auto& row : log->rows()) log->PrintRow(row);  // epochs done before the resume
    if (ranks_.hooks)  // a later attempt: the pool keeps only the epochs it has not seen
      for (size_t i = 0; i < log->rows().size(); ++i)
        ranks_.hooks->EpochDone(log->rows()[i], EpochCsvHeader(), log->csv_lines()[i]);
    if (progress_.epoch >= spec_.train.epochs || progress_.global_step >= total_steps)
      LogInfo("the job had already finished; use --resume none to train it again");
  }
  while (progress_.epoch < spec_.train.epochs && progress_.global_step < total_steps) {
    const int64_t epoch = progress_.epoch;
    TrainEpoch(epoch, total_steps, log ? &*log : nullptr);
    auto [eval_loss, eval_acc] = Evaluate();
    EpochRow row = MakeEpochRow(epoch, eval_loss, eval_acc, total_steps);
    if (log) log->AddEpoch(row);
    progress_ = TrainProgress{epoch + 1, 0, progress_.global_step};
    if (is_rank0()) SaveCheckpointNow("end of epoch");
    if (log && ranks_.hooks) ranks_.hooks->EpochDone(row, EpochCsvHeader(), log->csv_lines().back());
  }
  nlohmann::json summary = {{"job", spec_.name},
                            {"job_file", spec_.source_file},
                            {"status", "succeeded"},
                            {"global_step", progress_.global_step},
                            {"ranks", ranks_.world},
                            {"global_batch", spec_.train.batch_size * ranks_.world},
                            {"precision", ToString(spec_.train.precision)},
                            {"device", device_.str()},
                            {"threads", torch::get_num_threads()},
                            {"consistency_checks", consistency_checks_},
                            {"wall_time_s", MsSince(run_start) / 1000.0}};
  if (!log) return summary;
  const std::string model_dir = run_dir() + "/model";
  SaveHfModel(model_dir, model_);
  summary["model_dir"] = model_dir;
  summary["epochs"] = log->rows().size();
  if (!log->rows().empty()) {
    const EpochRow& last = log->rows().back();
    summary["final"] = {{"train_loss", last.train_loss}, {"eval_loss", last.eval_loss}, {"eval_acc", last.eval_acc}};
  }
  log->WriteSummary(summary);
  return summary;
}

}  // namespace trainyard
