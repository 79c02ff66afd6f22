#include "worker/jobs/trainer.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <thread>

#ifdef TRAINYARD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "common/clock.h"
#include "common/log.h"
#include "worker/jobs/trainer_parts.h"
#include "worker/train/batch_pipeline.h"
#include "worker/train/device_transfer.h"
#include "worker/train/lr_schedule.h"

namespace trainyard {
namespace {

// Bytes the caching allocator has handed out on `device` now: a host-side counter.
double CudaAllocatedMb(const torch::Device& device) {
#ifdef TRAINYARD_WITH_CUDA
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return double(stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current) /
         1048576.0;
#else
  (void)device;
  return 0;
#endif
}

// With graphed steps and no data.pad_buckets, batches are padded to this many lengths.
constexpr int kGraphPadBuckets = 4;

std::vector<int32_t> LengthProxies(const TextDataset& data) {
  std::vector<int32_t> lengths;
  lengths.reserve(data.examples.size());
  for (const auto& e : data.examples) lengths.push_back(static_cast<int32_t>(e.text.size()));
  return lengths;
}

// train.bf16_weights: every linear layer's weight stored in bf16, in place (the
// parameter keeps its identity; AdamW gives it an fp32 master). The biases stay fp32:
// the fused bias+GELU and add+LayerNorm kernels take fp32 biases, and autocast's cast
// of a bias is a vector's.
void StoreLinearWeightsInBf16(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& module : model.modules(/*include_self=*/true))
    if (auto* linear = module->as<torch::nn::LinearImpl>())
      linear->weight.set_data(linear->weight.to(torch::kBFloat16));
}

}  // namespace

Trainer::Trainer(JobSpec spec, RankContext ranks)
    : spec_(std::move(spec)), ranks_(ranks), totals_(std::make_unique<EpochTotals>()) {
  device_ = PrepareRuntime(spec_, ranks_);
  LoadData();
  BuildModel();
  ResolveResume();
}

Trainer::~Trainer() = default;

std::string Trainer::run_dir() const { return RunDir(spec_); }

void Trainer::LoadData() {
  labels_ = LoadLabels(spec_);
  train_ = LoadTexts(spec_, "data.train", spec_.data.train, &labels_);
  if (!spec_.data.dev.empty()) dev_ = LoadTexts(spec_, "data.dev", spec_.data.dev, &labels_);
  if (!spec_.eval.test.empty()) test_ = LoadTexts(spec_, "eval.test", spec_.eval.test, &labels_);
  tokenizer_ = LoadTokenizer(spec_, train_);
  train_tokens_ = std::make_unique<TokenCache>(train_, *tokenizer_, spec_.data.max_seq_len, kTokenCacheBytes);
  dev_tokens_ = std::make_unique<TokenCache>(dev_, *tokenizer_, spec_.data.max_seq_len, kTokenCacheBytes);
  test_tokens_ = std::make_unique<TokenCache>(test_, *tokenizer_, spec_.data.max_seq_len, kTokenCacheBytes);
  // The plan is made of global batches (batch_size per rank x ranks x micro-batches), so
  // any number of ranks, and any split of a step into micro-batches, sees the same global
  // order of samples; each rank takes its shard of each, in micro-batches.
  if (GlobalBatch() > std::numeric_limits<int>::max())
    throw InputError(spec_.Where("train.gradient_accumulation_steps") +
                     StrFormat(": a global batch of %ld examples (batch_size x ranks x micro-batches) is too large",
                               long(GlobalBatch())));
  sampler_ = std::make_unique<LengthBucketSampler>(LengthProxies(train_), int(GlobalBatch()), spec_.data.bucket_batches,
                                                   spec_.seed);
  steps_per_epoch_ = static_cast<int64_t>(sampler_->EpochPlan(0).size());
}

void Trainer::BuildModel() {
  model_ = trainyard::BuildModel(spec_, *tokenizer_, labels_.names(), spec_.data.max_seq_len,
                                 /*keep_init_labels=*/false, &lora_);
  model_->to(device_);
  if (spec_.train.bf16_weights) StoreLinearWeightsInBf16(*model_);
  if (spec_.model.lora.enabled && is_rank0())
    LogInfo(StrFormat("LoRA r=%ld on %zu layers (%s, ...): trainable params %ld of %ld (%.3f%%)", long(lora_.options.r),
                      lora_.adapted.size(), lora_.adapted.front().c_str(), long(lora_.trainable), long(lora_.total),
                      100.0 * double(lora_.trainable) / double(lora_.total)));
  // Only what is trained (all of it, or LoRA's adapters and saved modules) reaches the
  // optimizer, the gradient all-reduce and clipping.
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : model_->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    named.emplace_back(item.key(), item.value());
    params_.push_back(item.value());
  }
  const TrainSpec& t = spec_.train;
  optimizer_ = std::make_unique<AdamW>(named, AdamWOptions{t.adam_beta1, t.adam_beta2, t.adam_eps, t.weight_decay});
  scaler_ = std::make_unique<GradScaler>(t.loss_scale,
                                         t.precision == Precision::kFp16 || spec_.debug.force_loss_scaling, device_);
  if (WantsGraphs()) {
    graphs_ = std::make_unique<GraphedSteps>(device_);
    // Unpadding decides on the host, from the batch's mask, whether to pack it.
    model_->set_unpadding(Unpadding::kNever);
  }
  if (ranks_.comm) {
    ReducerOptions options;
    options.bucket_bytes = static_cast<int64_t>(spec_.distributed.bucket_mb * 1048576.0);
    options.overlap = spec_.distributed.overlap;
    options.fp16_compression = spec_.distributed.fp16_compression;
    auto make_reducer = [&] { reducer_ = std::make_unique<Reducer>(named, *ranks_.comm, options); };
    // The reducer keeps the parameters' AccumulateGrad nodes, which belong on the stream
    // the steps run on (GraphedSteps::OnStepStream).
    if (graphs_)
      graphs_->OnStepStream(make_reducer);
    else
      make_reducer();
  }
}

bool Trainer::WantsGraphs() const {
  const GraphMode mode = spec_.train.cuda_graph;
  if (mode == GraphMode::kOff) return false;
  const bool insist = mode == GraphMode::kOn;
  // A graph holds one step's work whole; accumulated micro-batches are several.
  if (spec_.train.gradient_accumulation_steps > 1) {
    if (insist)
      throw InputError(spec_.Where("train.cuda_graph") +
                       ": a graphed step holds one batch, not train.gradient_accumulation_steps micro-batches "
                       "(use auto or false)");
    return false;
  }
  if (!device_.is_cuda()) {
    if (insist)
      throw InputError(spec_.Where("train.cuda_graph") + ": CUDA graphs need a CUDA device; this job runs on " +
                       device_.str() + " (use auto or false)");
    return false;
  }
  // MPI's collectives wait on the host, which no graph can hold.
  if (ranks_.comm && ranks_.comm->backend() != "nccl") {
    if (insist)
      throw InputError(spec_.Where("train.cuda_graph") + ": a graphed step needs the NCCL backend, not " +
                       ranks_.comm->backend() + " (distributed.backend: nccl, or cuda_graph: auto or false)");
    return false;
  }
  return true;
}

double Trainer::LrAt(int64_t step, int64_t total_steps) const {
  return LrSchedule(spec_.train.lr_schedule, spec_.train.lr, spec_.train.warmup_ratio, total_steps).At(step);
}

bool Trainer::causal_lm() const { return spec_.task == TaskKind::kCausalLm; }

// A causal LM predicts token t+1 from position t: the targets are the ids shifted left
// by one, with padding (and the position after the last) ignored, as HF's loss does.
torch::Tensor Trainer::NextTokenTargets(const Batch& batch) {
  torch::Tensor ids = batch.input_ids.narrow(1, 1, batch.input_ids.size(1) - 1);
  torch::Tensor real = batch.attention_mask.narrow(1, 1, batch.attention_mask.size(1) - 1).to(torch::kBool);
  return ids.masked_fill(real.logical_not(), kIgnoredTarget);
}

// Cross-entropy of the task, in fp32: over the batch's labels for a classifier, over
// every predicted token for a causal LM (kMean: the mean per token, as HF's).
torch::Tensor Trainer::TaskLoss(const torch::Tensor& logits, const Batch& batch,
                                torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction) const {
  namespace F = torch::nn::functional;
  if (!causal_lm())
    return F::cross_entropy(logits.to(torch::kFloat), batch.labels, F::CrossEntropyFuncOptions().reduction(reduction));
  torch::Tensor predictions = logits.narrow(1, 0, logits.size(1) - 1).to(torch::kFloat);
  return F::cross_entropy(predictions.reshape({-1, predictions.size(2)}), NextTokenTargets(batch).reshape({-1}),
                          F::CrossEntropyFuncOptions().ignore_index(kIgnoredTarget).reduction(reduction));
}

int64_t Trainer::GlobalBatch() const {
  const int64_t ranks = ranks_.elastic_replicas > 0 ? ranks_.elastic_replicas * ranks_.world : ranks_.world;
  return int64_t(spec_.train.batch_size) * ranks * spec_.train.gradient_accumulation_steps;
}

void Trainer::TrainStep(std::vector<Batch>& micro, const double* loss_weights, double lr, StepTimer& timer,
                        PendingStep* step) {
  StepControls controls;
  controls.lr = lr;
  controls.loss_weight = loss_weights[0];
  controls.stop_vote = reducer_ && StopAsked(ranks_);
  controls.plant_inf =
      progress_.global_step + 1 == spec_.debug.plant_inf_step && ranks_.rank == spec_.debug.plant_inf_rank;
  if (controls.plant_inf)
    LogWarn(StrFormat("debug: planted an inf in rank %d's gradients at step %ld", ranks_.rank,
                      long(progress_.global_step + 1)));
  StepResult result;
  if (graphs_ && micro.front().size() > 0) {  // graphs_: one micro-batch (WantsGraphs)
    // One replay: its device time is the forward part's; the other parts read zero.
    result = graphs_->Run(micro.front(), controls, [this](Batch& b, const StepControls& c) {
      return StepBody(&b, 1, &c.loss_weight, c, nullptr);
    });
    for (int part = kForward; part < kNumTimedParts; ++part) timer.Mark();
  } else {
    result = StepBody(micro.data(), micro.size(), loss_weights, controls, &timer);
    if (reducer_ && micro.back().size() > 0) step->buckets_in_backward = int64_t(reducer_->launched_in_backward());
  }
  step->loss = result.loss.detach();
  step->found_inf = result.found_inf;
  if (scaler_->enabled()) step->scale = scaler_->scale_tensor().clone();
  if (spec_.distributed.check_consistency && ranks_.comm) CheckConsistency();
}

// The step's device work, with no wait for the device anywhere in it, so that a CUDA
// graph can hold it whole (graphed_steps.h): the stop vote, forward, the scaled
// backward, the gradient all-reduce, unscaling and the ranks' agreement on found_inf,
// clipping, AdamW (which skips itself on found_inf) and the scaler's update. `timer`
// marks the parts; null under capture.
StepResult Trainer::StepBody(Batch* micro, size_t count, const double* loss_weights, const StepControls& c,
                             StepTimer* timer) {
  if (reducer_) {
    if (c.graphed())
      reducer_->PrepareForBackward(c.device.stop_vote);
    else
      reducer_->PrepareForBackward(c.stop_vote);
  }
  const torch::Tensor loss = AccumulateGradients(micro, count, loss_weights, c, timer);
  // A rank whose last micro-batch is empty ran no backward to launch the all-reduce.
  if (reducer_ && micro[count - 1].size() == 0) reducer_->ContributeWithoutBackward();
  if (reducer_) reducer_->FinishBackward();
  if (timer) timer->Mark(kComm);  // exposed communication
  PlantDebugInf(c);
  const torch::Tensor found_inf = AgreeOnFoundInf(scaler_->UnscaleAndCheck(params_));
  optimizer_->TakeGradients();  // into the fp32 masters, under train.bf16_weights
  if (spec_.train.max_grad_norm > 0) ClipGradNorm(optimizer_->updated(), spec_.train.max_grad_norm);
  if (c.graphed())
    optimizer_->Step(c.device.lr, found_inf);
  else
    optimizer_->Step(c.lr, found_inf);
  scaler_->Update(found_inf);
  optimizer_->ZeroGrad();
  if (timer) timer->Mark(kOptimizer);
  return {loss, found_inf};
}

torch::Tensor Trainer::AccumulateGradients(Batch* micro, size_t count, const double* loss_weights,
                                           const StepControls& c, StepTimer* timer) {
  auto mark = [timer](int part) {
    if (timer) timer->Mark(part);
  };
  torch::Tensor loss, loss_sum;
  int64_t examples = 0;
  int micro_with_examples = 0;
  for (size_t m = 0; m < count; ++m) {
    Batch& batch = micro[m];
    // Gradients accumulate in place; the all-reduce runs in the last backward alone.
    if (reducer_) reducer_->set_accumulating(m + 1 < count);
    if (batch.size() == 0) {
      mark(kForward);
      mark(kBackward);
      continue;
    }
    torch::Tensor micro_loss;
    {
      AutocastScope autocast(device_.type(), spec_.train.precision);
      micro_loss = TaskLoss(ForwardBatch(*model_, batch), batch, torch::kMean);
    }
    mark(kForward);
    // loss_weight makes the average over ranks the mean over the global batch, also
    // when the ranks' shards, or the micro-batches, differ in size.
    torch::Tensor weighted = c.graphed() ? micro_loss * c.device.loss_weight : micro_loss * loss_weights[m];
    scaler_->Scale(weighted).backward();
    mark(kBackward);
    loss = micro_loss.detach();
    const torch::Tensor counted = loss * double(batch.size());
    loss_sum = loss_sum.defined() ? loss_sum + counted : counted;
    examples += int64_t(batch.size());
    ++micro_with_examples;
  }
  if (micro_with_examples == 0) return torch::zeros({}, torch::TensorOptions(torch::kFloat).device(device_));
  return micro_with_examples == 1 ? loss : loss_sum / double(examples);
}

// debug.plant_inf_step: an inf in the first gradient, to test the skip. A graphed step
// holds the plant whenever the job asks for one, and reads whether to plant from the
// device, so that the same graph serves every step.
void Trainer::PlantDebugInf(const StepControls& c) {
  if (spec_.debug.plant_inf_step <= 0 || !params_.front().grad().defined()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor first = params_.front().mutable_grad().view({-1}).narrow(0, 0, 1);
  if (!c.graphed()) {
    if (c.plant_inf) first.fill_(std::numeric_limits<float>::infinity());
    return;
  }
  first.copy_(torch::where(c.device.plant_inf > 0, std::numeric_limits<double>::infinity(), first));
}

Trainer::StepLog::StepLog(Trainer& trainer, int64_t epoch, int64_t total_steps, RunLog* log)
    : t_(trainer),
      epoch_(epoch),
      log_(log),
      timer_(trainer.device_, kNumTimedParts),
      line_(StrFormat("epoch %ld/%ld", long(epoch + 1), long(trainer.EpochsToRun(total_steps))),
            std::min(trainer.steps_per_epoch_, total_steps - epoch * trainer.steps_per_epoch_),
            trainer.spec_.log.progress && trainer.is_rank0(), trainer.progress_.next_batch) {}

void Trainer::StepLog::Flush() {
  if (pending_.empty()) return;
  // Per step: its loss and, under loss scaling, its found_inf and scale; then the votes.
  const bool scaled = t_.scaler_->enabled();
  const size_t per_step = scaled ? 3 : 1;
  std::vector<torch::Tensor> values;
  for (const auto& p : pending_) {
    values.push_back(p.loss.to(torch::kFloat).reshape({}));
    if (scaled) {
      values.push_back(p.found_inf.reshape({}));
      values.push_back(p.scale.reshape({}));
    }
  }
  const bool votes = t_.reducer_ && (t_.ranks_.hooks || t_.ranks_.stop_signal);
  if (votes) values.push_back(t_.reducer_->StopVotes().to(torch::kFloat).reshape({}));
  torch::Tensor host = torch::stack(values).to(torch::kCPU);
  std::vector<std::vector<double>> times = timer_.Collect();
  const float* read = host.data_ptr<float>();
  for (size_t i = 0; i < pending_.size(); ++i) {
    const float* step = read + i * per_step;
    Account(pending_[i], StepValues{step[0], scaled && step[1] != 0.0f, scaled ? double(step[2]) : 0.0}, times[i]);
  }
  line_.Update(t_.progress_.next_batch,
               StrFormat("loss %.4f  %.1f ms/step  wait %.1f%%",
                         t_.progress_.epoch_loss_sum / double(std::max<int64_t>(1, t_.progress_.epoch_examples)),
                         MsSince(t_.totals_->start) / double(std::max<int64_t>(1, t_.totals_->steps)),
                         100.0 * t_.totals_->wait / std::max(1e-9, MsSince(t_.totals_->start))));
  const int64_t newest = pending_.back().step;
  pending_.clear();
  if (votes && read[values.size() - 1] > 0)
    throw JobStopped(StrFormat("stopped on request after step %ld of epoch %ld", long(newest), long(epoch_ + 1)));
}

void Trainer::StepLog::Finish() {
  Flush();
  line_.Finish();
}

void Trainer::StepLog::Account(const PendingStep& p, const StepValues& v, const std::vector<double>& ms) {
  t_.progress_.epoch_loss_sum += v.loss * double(p.examples);
  t_.progress_.epoch_skipped += v.skipped;
  EpochTotals& totals = *t_.totals_;
  totals.wait += p.wait_ms;
  double step_ms = p.wait_ms;
  for (int part = 0; part < kNumTimedParts; ++part) {
    totals.parts[part] += ms[part];
    step_ms += ms[part];
  }
  if (t_.trace_) Trace(p, ms);
  ++totals.steps;
  totals.samples += p.examples;
  if (p.step % t_.spec_.log.steps_every == 0) LogStep(p, v, step_ms, ms[kComm]);
}

// One steps.jsonl line. Every rank takes part: with several ranks the line names the
// rank whose step took longest ("<host>:<rank>"), from one small gather per logged step.
void Trainer::StepLog::LogStep(const PendingStep& p, const StepValues& v, double step_ms, double comm_ms) {
  nlohmann::json line = {
      {"step", p.step},     {"epoch", epoch_ + 1},        {"loss", v.loss},       {"lr", p.lr},
      {"ms", step_ms},      {"wait_ms", p.wait_ms},       {"skipped", v.skipped}, {"loss_scale", v.loss_scale},
      {"tokens", p.tokens}, {"padded_len", p.padded_len}, {"comm_ms", comm_ms}};
  if (t_.device_.is_cuda()) line["cuda_allocated_mb"] = CudaAllocatedMb(t_.device_);
  if (p.buckets_in_backward >= 0) line["buckets_in_backward"] = p.buckets_in_backward;
  if (p.replicas > 0) line["replicas"] = p.replicas;
  if (p.packed_tokens > 0) line["packed_tokens"] = p.packed_tokens;
  if (t_.ranks_.comm && t_.ranks_.world > 1) {
    const auto all = t_.ranks_.comm->AllGather({step_ms}, StrFormat("step time of step %ld", long(p.step)));
    int slowest = 0;
    for (int r = 1; r < int(all.size()); ++r)
      if (all[r][0] > all[slowest][0]) slowest = r;
    line["slowest"] = t_.ranks_.comm->RankName(slowest);
    line["slowest_ms"] = all[slowest][0];
  }
  if (log_) log_->AddStep(line);
}

// The step's parts laid end to end from the start of its wait: exact on the CPU,
// where the parts are host time between marks; on CUDA they are device times, laid
// from the host's start.
void Trainer::StepLog::Trace(const PendingStep& p, const std::vector<double>& ms) {
  int64_t at = p.begin_us;
  auto span = [&](const char* name, double part_ms) {
    const int64_t end = at + std::llround(part_ms * 1000.0);
    t_.trace_->Span(name, TraceRecorder::kStepTrack, p.step, at, end);
    at = end;
  };
  span(kStepParts[0], p.wait_ms);
  for (int part = 0; part < kNumTimedParts; ++part) span(kStepParts[part + 1], ms[part]);
}

Trainer::MicroPlan Trainer::PlanMicroBatches(int64_t epoch) const {
  std::vector<BatchIndices> plan = sampler_->EpochPlan(epoch);
  plan.erase(plan.begin(), plan.begin() + std::min<int64_t>(progress_.next_batch, plan.size()));
  // A global batch is split as evenly as possible over the ranks, and a rank's shard over
  // its micro-batches. With fewer examples than ranks x micro-batches some micro-batches
  // are empty and add no gradient (a rank with no examples at all contributes zeros).
  // Nothing is dropped or padded. A micro-batch's loss weight makes the ranks' average
  // of their weighted micro-batch means the mean over the global batch.
  const int count = spec_.train.gradient_accumulation_steps;
  MicroPlan out;
  for (const BatchIndices& global : plan) {
    const size_t n = global.size();
    const auto [shard_begin, shard_end] = RankShard(n, ranks_.rank, ranks_.world);
    for (int m = 0; m < count; ++m) {
      const auto [begin, end] = RankShard(shard_end - shard_begin, m, count);
      out.batches.emplace_back(global.begin() + shard_begin + begin, global.begin() + shard_begin + end);
      out.loss_weights.push_back(double(end - begin) * double(ranks_.world) / double(n));
    }
  }
  return out;
}

PipelineOptions Trainer::BatchOptions(TokenCache* tokens) const {
  PipelineOptions options = PipelineOptionsFor(spec_, device_);
  options.cache = tokens;
  // model.unpad: always has the host find an encoder's real tokens (token_index.h), on
  // any device; under auto the CPU finds them where they pay, and a GPU runs padded.
  const bool packed = !causal_lm() && spec_.model.unpad == "always";
  if (packed) options.packing = {Unpadding::kAlways, graphs_ != nullptr};
  // A graph per batch shape: padded lengths bucketed to a few. A packed batch costs its
  // token count, which has a graph of its own, whatever the padded length, so there
  // one length (max_seq_len) keeps the graphs to the token counts'.
  if (graphs_ && options.pad_lengths.empty())
    options.pad_lengths =
        packed ? std::vector<int>{options.max_len} : PadBucketLengths(kGraphPadBuckets, options.max_len);
  return options;
}

void Trainer::TrainEpoch(int64_t epoch, int64_t total_steps, RunLog* log) {
  MicroPlan plan = PlanMicroBatches(epoch);
  BatchPipeline pipeline(train_, *tokenizer_, std::move(plan.batches), BatchOptions(train_tokens_.get()));
  DeviceTransfer transfer(device_);
  StepLog steps(*this, epoch, total_steps, log);
  const size_t per_step = size_t(spec_.train.gradient_accumulation_steps);
  model_->train();
  *totals_ = EpochTotals{};
  EvaluateAndCheckpointIfDue(log, false);  // one a stop at its step kept from being made
  for (size_t first_micro = 0; progress_.global_step < total_steps && !StoppedEarly(); first_micro += per_step) {
    // Without a reducer to carry the stop votes (a single rank), look at the request here,
    // with every step before it read (the epoch sums a checkpoint keeps).
    if (!reducer_ && StopAsked(ranks_)) {
      steps.Flush();
      AgreeOnStop(ranks_, [&] {
        return StrFormat("at step %ld of epoch %ld", long(progress_.global_step), long(progress_.epoch + 1));
      });
    }
    profiler_->BeforeStep(progress_.global_step + 1);
    PendingStep step;
    if (trace_) step.begin_us = TraceRecorder::NowUs();
    if (reducer_) reducer_->set_trace_step(progress_.global_step + 1);
    auto start = Clock::now();
    std::vector<Batch> micro = NextMicroBatches(pipeline, per_step);
    if (micro.size() < per_step) break;
    step.wait_ms = MsSince(start);
    steps.timer().Begin();
    for (Batch& batch : micro) batch = transfer.ToDevice(std::move(batch));
    steps.timer().Mark(kH2d);
    step.lr = LrAt(progress_.global_step, total_steps);
    TrainStep(micro, &plan.loss_weights[first_micro], step.lr, steps.timer(), &step);
    CountStep(micro, &step);
    steps.Add(std::move(step));
    profiler_->AfterStep(progress_.global_step);
    if (!AfterStep(steps, log)) break;
  }
  steps.Finish();
}

bool Trainer::AfterStep(StepLog& steps, RunLog* log) {
  const int64_t step = progress_.global_step;
  // On CPU reading a step costs nothing; on CUDA it waits for the device, so it is
  // done once per logging interval, and before evaluations and checkpoints, which need
  // the sums. Every rank reads at the same steps, since a read may act on the ranks'
  // stop votes.
  const int64_t flush_every = device_.is_cuda() ? spec_.log.steps_every : 1;
  const int64_t checkpoint_every = spec_.checkpoint.every_steps;
  const bool checkpoint = checkpoint_every > 0 && step % checkpoint_every == 0;
  if (checkpoint || EvaluationDue() || step % flush_every == 0) steps.Flush();
  // The evaluation comes first: the checkpoint then holds what it judged.
  EvaluateAndCheckpointIfDue(log, checkpoint);  // collective
  if (spec_.debug.step_pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(spec_.debug.step_pause_ms));
  return !StoppedEarly();
}

std::vector<Batch> Trainer::NextMicroBatches(BatchPipeline& pipeline, size_t count) {
  std::vector<Batch> micro;
  while (micro.size() < count) {
    std::optional<Batch> host = pipeline.Next();
    if (!host) break;
    micro.push_back(std::move(*host));
  }
  return micro;
}

void Trainer::CountStep(const std::vector<Batch>& micro, PendingStep* step) {
  step->step = ++progress_.global_step;
  for (const Batch& batch : micro) {
    step->examples += int64_t(batch.size());
    step->tokens += batch.real_tokens;
    if (batch.input_ids.dim() == 2) step->padded_len = std::max<int64_t>(step->padded_len, batch.input_ids.size(1));
    if (batch.packing.defined()) step->packed_tokens += batch.packing.index.size(0);
  }
  ++progress_.next_batch;
  ++progress_.epoch_steps;
  progress_.epoch_examples += step->examples;
}

nlohmann::json Trainer::Run() {
  const auto run_start = Clock::now();
  if (ranks_.comm) {
    SettleCheckpoints();
    BroadcastParameters();
    AgreeOnResumePoint();
  }
  const int64_t total_steps = TotalSteps();
  if (resume_from_ && !HasEpochToRun(total_steps)) return ShowFinishedRun();  // before anything is written
  StartTrace();  // right after the collectives above: the ranks' time zeros line up
  profiler_ = std::make_unique<StepProfiler>(
      run_dir() + "/profile" + (ranks_.world > 1 ? ".rank" + std::to_string(ranks_.rank) : std::string()),
      spec_.log.profile_from_step, spec_.log.profile_steps, device_.is_cuda());
  if (WritesCheckpoints()) PrepareCheckpointFolder();
  std::optional<RunLog> log;
  if (is_rank0()) {
    log.emplace(run_dir(), resume_from_ ? progress_.epoch + 1 : 0, progress_.global_step);
    WriteEffectiveJob(spec_);
    OpenRunLog(*log);
  }
  while (HasEpochToRun(total_steps)) TrainAndEvaluateEpoch(total_steps, log ? &*log : nullptr);
  WriteTrace();
  nlohmann::json summary = Summary(run_start);
  RestoreBestWeights(&summary);                   // collective
  EvaluateTest(log ? &*log : nullptr, &summary);  // collective
  if (log) SaveResults(*log, &summary);
  return summary;
}

int64_t Trainer::EpochsToRun(int64_t total_steps) const {
  if (steps_per_epoch_ <= 0) return spec_.train.epochs;
  return std::min<int64_t>(spec_.train.epochs, (total_steps + steps_per_epoch_ - 1) / steps_per_epoch_);
}

int64_t Trainer::TotalSteps() const {
  const int64_t all = steps_per_epoch_ * spec_.train.epochs;
  return spec_.train.max_steps > 0 ? std::min(all, spec_.train.max_steps) : all;
}

bool Trainer::HasEpochToRun(int64_t total_steps) const {
  if (progress_.epoch >= spec_.train.epochs) return false;
  if (StoppedEarly()) return false;  // its epoch has its row (TrainAndEvaluateEpoch)
  return progress_.global_step < total_steps || (steps_per_epoch_ > 0 && progress_.next_batch >= steps_per_epoch_);
}

void Trainer::TrainAndEvaluateEpoch(int64_t total_steps, RunLog* log) {
  const int64_t epoch = progress_.epoch;
  try {
    TrainEpoch(epoch, total_steps, log);
  } catch (const JobStopped& stopped) {
    if (!StopIsPreemption()) throw;
    // A scheduler's signal, or a coordinator's preemption: keep the place, as max_steps
    // does inside an epoch, so that a rerun resuming from the checkpoint goes on from
    // the next batch.
    SaveCheckpointNow("preempted");  // collective: every rank stopped at this step
    throw JobPreempted(std::string(stopped.what()) +
                       StrFormat(" (%s); checkpoint of step %ld written, a rerun resuming from it goes on there",
                                 ranks_.stop_signal ? "a signal" : "a preemption", long(progress_.global_step)));
  }
  CloseEpoch(epoch, total_steps, log);
}

void Trainer::CloseEpoch(int64_t epoch, int64_t total_steps, RunLog* log) {
  // train.max_steps (--max-steps) or early stopping may end the run inside an epoch.
  // Its checkpoint keeps the place there: a resume goes on from the epoch's next batch,
  // and the row below is replaced once the epoch is whole. The evaluation comes first,
  // so that the checkpoint holds what it judged.
  const bool whole_epoch = progress_.next_batch >= steps_per_epoch_;
  const Evaluation eval = EvaluateDev(log);  // collective
  if (!whole_epoch) SaveCheckpointNow(StoppedEarly() ? "early stopping" : "max_steps, inside the epoch");
  EpochRow row = MakeEpochRow(epoch, eval, total_steps);
  if (log) log->AddEpoch(row);
  if (whole_epoch) {
    TrainProgress next;
    next.epoch = epoch + 1;
    next.global_step = progress_.global_step;
    next.evals = progress_.evals;
    next.replicas.last = progress_.replicas.last;
    progress_ = next;
    SaveCheckpointNow("end of epoch");  // collective
  }
  if (log && ranks_.hooks) ranks_.hooks->EpochDone(row, EpochCsvHeader(), log->csv_lines().back());
}

}  // namespace trainyard
