// Note [Elastic finetune]
// One replica of an elastic finetune job is one process (ranks.world 1) that trains
// through ElasticReplica (Note [Elastic steps] in worker/elastic/elastic_replica.h): the
// quorum decides who takes part in each step, the ring sums the members' shares, and a
// step counts only once the quorum commits it. What the replica trains is Run's job,
// step for step:
//  - the global batch is batch_size x the replicas at full strength (ranks.
//    elastic_replicas) x gradient_accumulation_steps, whatever the number of replicas
//    in a step's quorum; the sampler's plan for an epoch is the same on every replica,
//    and member i of q takes the shard RankShard(n, i, q) of the step's n examples, cut
//    into gradient_accumulation_steps micro-batches each weighted by its examples / n,
//    so that the members' shares add up to the global batch's mean gradient, as the
//    ranks' do in Run. Fewer replicas each take a larger shard; the learning rate and
//    its schedule do not change, since the step's batch does not.
//  - The shares travel as one float vector: the gradients of the trained parameters,
//    flattened in order, then the share's loss sum and examples, so that the step's loss
//    is the global batch's mean too.
//  - A committed step's sum goes into the gradients, and the rest is Run's: unscaling
//    and found_inf (the same on every member, since the summed gradients are), clipping,
//    AdamW, the scaler, the step's record in steps.jsonl (with `replicas`, the quorum's
//    size), the evaluations and checkpoints due, and after an epoch's last step its
//    evaluation, row and checkpoint. Every member does these at the same step with the
//    same weights; each writes its own run folder (its host's), and a coordinator keeps
//    one row per epoch.
//  - A step that does not commit leaves nothing behind: the share's gradients are
//    zeroed once copied out, and the step is taken again in the next quorum. Its time
//    counts in the step's communication part.
//  - A heal passes a checkpoint's bytes (SaveCheckpoint: the trained parameters, AdamW's
//    moments, the scaler, the loop position and this replica's RNG state) from a member
//    to a joiner, which loads them as a resume would: it goes on from the step after.
// Not for graphed steps (their all-reduce is the reducer's, inside the graph) or a
// replica of several ranks (a communicator inside the replica: not yet).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "common/log.h"
#include "worker/elastic/elastic_replica.h"
#include "worker/jobs/trainer.h"
#include "worker/jobs/trainer_parts.h"
#include "worker/train/device_transfer.h"

namespace trainyard {
namespace {

// A private file for a heal's checkpoint: SaveCheckpoint and LoadCheckpoint take paths.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& dir) : path_(dir + "/heal-XXXXXX") {
    const int fd = ::mkstemp(path_.data());
    if (fd < 0) throw std::runtime_error("cannot make a file for a heal's state in " + dir);
    ::close(fd);
  }
  ~ScratchFile() { std::remove(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

size_t FloatsOf(const std::vector<torch::Tensor>& params) {
  size_t floats = 0;
  for (const torch::Tensor& p : params) floats += static_cast<size_t>(p.numel());
  return floats;
}

}  // namespace

struct Trainer::ElasticProgress {
  int64_t total_steps = 0;
  RunLog* log = nullptr;
  std::unique_ptr<StepLog> steps;  // of the epoch in progress
  int64_t steps_epoch = -1;
  bool step_open = false;  // its timer holds the step being taken (again, after a retry)
  std::vector<BatchIndices> plan;
  int64_t plan_epoch = -1;
  int members = 0;  // of the step being taken
  int64_t tokens = 0, padded_len = 0;
  std::unique_ptr<DeviceTransfer> transfer;  // made at the first step, kept for every later one
};

// Thrown from a step's application when early stopping ends the run: the replica
// leaves its quorum with it, as every member does at the same step.
struct ElasticEarlyStop {};

void Trainer::OpenElasticSteps(ElasticProgress& e, int64_t epoch) {
  if (e.steps && e.steps_epoch == epoch) return;
  e.steps.reset();  // a healed replica's, of an epoch it no longer trains
  *totals_ = EpochTotals{};
  e.steps = std::make_unique<StepLog>(*this, epoch, e.total_steps, e.log);
  e.steps_epoch = epoch;
  e.step_open = false;
}

void Trainer::ElasticAccumulate(ElasticProgress& e, int64_t step, int position, int members, std::vector<float>* sum) {
  const int64_t epoch = (step - 1) / steps_per_epoch_;
  OpenElasticSteps(e, epoch);
  StepTimer& timer = e.steps->timer();
  if (e.step_open) {
    timer.Mark(kComm);  // a retry: the failed exchange and its decision are communication
  } else {
    timer.Begin();
    e.step_open = true;
  }
  if (e.plan_epoch != epoch) {
    e.plan = sampler_->EpochPlan(epoch);
    e.plan_epoch = epoch;
  }
  const BatchIndices& global = e.plan.at(static_cast<size_t>((step - 1) % steps_per_epoch_));
  const size_t n = global.size();
  const auto [shard_begin, shard_end] = RankShard(n, position, members);
  const int count = spec_.train.gradient_accumulation_steps;
  const PipelineOptions options = BatchOptions(train_tokens_.get());
  if (!e.transfer) e.transfer = std::make_unique<DeviceTransfer>(device_);
  std::vector<Batch> micro;
  std::vector<double> weights;
  e.tokens = e.padded_len = 0;
  for (int m = 0; m < count; ++m) {
    const auto [begin, end] = RankShard(shard_end - shard_begin, m, count);
    const BatchIndices indices(global.begin() + long(shard_begin + begin), global.begin() + long(shard_begin + end));
    Batch batch = CollateBatch(train_, *tokenizer_, indices, options.max_len, options.pin_memory, options.cache,
                               options.pad_lengths);
    e.tokens += batch.real_tokens;
    if (batch.input_ids.dim() == 2) e.padded_len = std::max<int64_t>(e.padded_len, batch.input_ids.size(1));
    micro.push_back(e.transfer->ToDevice(std::move(batch)));
    weights.push_back(double(end - begin) / double(n));
  }
  timer.Mark(kH2d);
  StepControls controls;
  const torch::Tensor loss = AccumulateGradients(micro.data(), micro.size(), weights.data(), controls, &timer);
  size_t at = 0;
  for (const torch::Tensor& p : params_) {
    const auto floats = static_cast<size_t>(p.numel());
    if (p.grad().defined()) {
      const torch::Tensor g = p.grad().detach().to(torch::kCPU, torch::kFloat).contiguous();
      const float* from = g.data_ptr<float>();
      for (size_t i = 0; i < floats; ++i) (*sum)[at + i] += from[i];
    }
    at += floats;
  }
  const double examples = double(shard_end - shard_begin);
  (*sum)[at] += static_cast<float>(loss.item<double>() * examples);
  (*sum)[at + 1] += static_cast<float>(examples);
  optimizer_->ZeroGrad();  // nothing of a step that does not commit stays
  e.members = members;
}

void Trainer::ElasticApply(ElasticProgress& e, int64_t step, const std::vector<float>& sum) {
  StepTimer& timer = e.steps->timer();
  timer.Mark(kComm);
  size_t at = 0;
  {
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : params_) {
      const torch::Tensor g = torch::from_blob(const_cast<float*>(sum.data() + at), p.sizes(), torch::kFloat);
      p.mutable_grad() = g.to(p.options(), /*non_blocking=*/false, /*copy=*/true);
      at += static_cast<size_t>(p.numel());
    }
  }
  PendingStep record;
  record.step = step;
  record.lr = LrAt(step - 1, e.total_steps);
  const torch::Tensor found_inf = scaler_->UnscaleAndCheck(params_);
  optimizer_->TakeGradients();
  if (spec_.train.max_grad_norm > 0) ClipGradNorm(optimizer_->updated(), spec_.train.max_grad_norm);
  optimizer_->Step(record.lr, found_inf);
  scaler_->Update(found_inf);
  optimizer_->ZeroGrad();
  timer.Mark(kOptimizer);
  e.step_open = false;
  record.examples = std::llround(sum[at + 1]);
  record.loss = torch::tensor(double(sum[at]) / double(std::max<int64_t>(1, record.examples)));
  record.found_inf = found_inf;
  if (scaler_->enabled()) record.scale = scaler_->scale_tensor().clone();
  record.tokens = e.tokens;
  record.padded_len = e.padded_len;
  record.replicas = e.members;
  NoteQuorumSize(progress_.replicas, e.members);
  progress_.global_step = step;
  ++progress_.next_batch;
  ++progress_.epoch_steps;
  progress_.epoch_examples += record.examples;
  e.steps->Add(std::move(record));
  const bool go_on = AfterStep(*e.steps, e.log);
  if (progress_.next_batch >= steps_per_epoch_ || step == e.total_steps || !go_on) {
    e.steps->Finish();
    e.steps.reset();
    CloseEpoch(e.steps_epoch, e.total_steps, e.log);
  }
  if (!go_on) throw ElasticEarlyStop{};
}

// A cancel or a preemption, between steps: every step this replica took is committed.
// A preemption keeps the place in a checkpoint, as Run does (each replica its own; the
// next attempt heals the ones behind from the furthest).
void Trainer::StopElastic(ElasticProgress& e) {
  if (e.steps) e.steps->Finish();
  const std::string where = StrFormat("stopped on request after step %ld of epoch %ld", long(progress_.global_step),
                                      long(progress_.epoch + 1));
  if (!StopIsPreemption()) throw JobStopped(where);
  SaveCheckpointNow("preempted");
  throw JobPreempted(where + StrFormat(" (a preemption); checkpoint of step %ld written, a rerun resuming from it "
                                       "goes on there",
                                       long(progress_.global_step)));
}

std::vector<uint8_t> Trainer::SaveElasticState() {
  ScratchFile file(run_dir());
  SaveCheckpoint(file.path(), *model_, *optimizer_, *scaler_, progress_, {CaptureRngState(*model_)});
  std::ifstream in(file.path(), std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void Trainer::LoadElasticState(const std::vector<uint8_t>& bytes) {
  ScratchFile file(run_dir());
  std::ofstream(file.path(), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
  progress_ = LoadCheckpoint(file.path(), *model_, *optimizer_, *scaler_, 0, steps_per_epoch_).progress;
  LogInfo(StrFormat("healed from a live replica (%.1f MB): after step %ld, in epoch %ld", double(bytes.size()) / 1e6,
                    long(progress_.global_step), long(progress_.epoch + 1)));
}

nlohmann::json Trainer::RunElastic(const ElasticRun& elastic) {
  if (ranks_.world != 1 || ranks_.elastic_replicas < 1)
    throw InputError("an elastic replica is one process here, with the replicas at full strength set");
  if (graphs_) throw InputError("train.cuda_graph: elastic steps are not graphed; set it to false");
  const auto run_start = Clock::now();
  ElasticProgress e;
  e.total_steps = TotalSteps();
  if (resume_from_ && !HasEpochToRun(e.total_steps)) return ShowFinishedRun();
  StartTrace();
  profiler_ = std::make_unique<StepProfiler>(run_dir() + "/profile", spec_.log.profile_from_step,
                                             spec_.log.profile_steps, device_.is_cuda());
  PrepareCheckpointFolder();
  std::optional<RunLog> log;
  log.emplace(run_dir(), resume_from_ ? progress_.epoch + 1 : 0, progress_.global_step);
  WriteEffectiveJob(spec_);
  OpenRunLog(*log);
  e.log = &*log;
  model_->train();
  ElasticModel view;
  view.gradient_size = FloatsOf(params_) + 2;
  view.accumulate = [this, &e](int64_t step, int position, int members, std::vector<float>* sum) {
    ElasticAccumulate(e, step, position, members, sum);
  };
  view.apply = [this, &e](int64_t step, const std::vector<float>& sum) { ElasticApply(e, step, sum); };
  view.save = [this] { return SaveElasticState(); };
  view.load = [this](const std::vector<uint8_t>& bytes) { LoadElasticState(bytes); };
  view.stop_requested = [this] { return StopAsked(ranks_); };
  ElasticReplica replica(*elastic.listener, *elastic.link, std::move(view),
                         RingOptions{elastic.timeout_s, elastic.secret});
  try {
    const int64_t reached = replica.RunUntil(progress_.global_step, e.total_steps);
    if (replica.stopped()) StopElastic(e);
    if (reached < e.total_steps)
      throw std::runtime_error(
          StrFormat("no quorum takes this replica any more, after step %ld%s", long(reached),
                    replica.last_failure().empty() ? "" : (" (" + replica.last_failure() + ")").c_str()));
  } catch (const ElasticEarlyStop&) {
  }
  WriteTrace();
  nlohmann::json summary = Summary(run_start);
  RestoreBestWeights(&summary);
  EvaluateTest(&*log, &summary);
  SaveResults(*log, &summary);
  return summary;
}

}  // namespace trainyard
