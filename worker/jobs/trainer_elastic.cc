// Note [Elastic finetune]
// One replica of an elastic finetune job is one process, or several (Note [Elastic
// replica of several ranks] below), that trains through ElasticReplica (Note [Elastic
// steps] in worker/elastic/elastic_replica.h): the quorum decides who takes part in each
// step, the ring sums the members' shares, and a step counts only once the quorum
// commits it. What the replica trains is Run's job, step for step:
//  - the global batch is batch_size x the replicas at full strength (ranks.
//    elastic_replicas) x a replica's ranks x gradient_accumulation_steps, whatever the
//    number of replicas in a step's quorum; the sampler's plan for an epoch is the same
//    on every replica, and member i of q takes the shard RankShard(n, i, q) of the step's
//    n examples, cut into gradient_accumulation_steps micro-batches each weighted by its
//    examples / n, so that the members' shares add up to the global batch's mean
//    gradient, as the ranks' do in Run. Fewer replicas each take a larger shard; the
//    learning rate and its schedule do not change, since the step's batch does not.
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
//    moments, the scaler, the loop position and the replica's ranks' RNG states) from a
//    member to a joiner, which loads them as a resume would: it goes on from the step
//    after.
// Not for graphed steps (their all-reduce is the reducer's, inside the graph).
//
// Note [Elastic replica of several ranks]
// A replica may be several ranks (one host's, under one srun), with today's communicator
// inside it: its rank 0 is the quorum's member, with the ring and the link, and drives
// the others through that communicator with one command for each of ElasticReplica's
// calls, a broadcast of four integers the others wait on without a deadline
// (Communicator::AwaitBroadcast: rank 0 may wait on the quorum for as long as it takes):
//  - accumulate(step, position, members): every rank takes its part of the member's
//    shard (RankShard of it over the replica's ranks), the reducer sums the ranks'
//    gradients in backward as in Run (each micro-batch weighted by its examples x ranks
//    / n), and the parts' loss sums and examples are summed too; rank 0's copy of the
//    share goes on the ring;
//  - apply(step): the ring's sum, broadcast from rank 0, goes into every rank's
//    gradients, and every rank takes the step alike, so the replica's ranks keep the
//    same weights;
//  - save(): each rank's RNG state goes to rank 0 (GatherRngStates), which writes the
//    heal's checkpoint; load(size): its bytes, broadcast from rank 0, are loaded by each
//    rank, its own RNG state included (the replicas of a job have the same ranks);
//  - end(step, stopped): where rank 0's steps ended, and whether on a stop request;
//    every rank goes on from there alike.
// A rank that dies takes its replica down with it (its launcher ends the others: mpirun
// or srun --kill-on-bad-exit); rank 0 failing otherwise aborts the replica's world
// (RankResult::abort_world), so no rank waits on a command that never comes.
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
  int64_t tokens = 0, padded_len = 0, packed_tokens = 0;
  std::unique_ptr<DeviceTransfer> transfer;  // made at the first step, kept for every later one
};

// Thrown from a step's application when early stopping ends the run: the replica
// leaves its quorum with it, as every member does at the same step.
struct ElasticEarlyStop {};

// Where the replica's steps ended: the last step committed, and whether on a stop request.
struct Trainer::ElasticEnd {
  int64_t reached = 0;
  bool stopped = false;
  std::string why;  // rank 0's last failure, when it did not reach the end
};

namespace {

// Note [Elastic replica of several ranks]: what rank 0 asks of the replica's others.
enum class ElasticCommand : int64_t { kAccumulate = 1, kApply, kSave, kLoad, kEnd };

struct ElasticOrder {
  ElasticCommand command = ElasticCommand::kEnd;
  int64_t a = 0, b = 0, c = 0;
};

// Rank 0's `order` on every rank of the replica (rank 0 passes it, the others receive it).
ElasticOrder PassOrder(Communicator& comm, ElasticOrder order) {
  torch::Tensor t = torch::tensor({static_cast<int64_t>(order.command), order.a, order.b, order.c}, torch::kLong);
  comm.AwaitBroadcast(t, 0, "an elastic replica's command");
  const int64_t* v = t.data_ptr<int64_t>();
  return {static_cast<ElasticCommand>(v[0]), v[1], v[2], v[3]};
}

}  // namespace

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
  const auto [member_begin, member_end] = RankShard(n, position, members);
  const auto [part_begin, part_end] = RankShard(member_end - member_begin, ranks_.rank, ranks_.world);
  const size_t shard_begin = member_begin + part_begin, shard_end = member_begin + part_end;
  const int count = spec_.train.gradient_accumulation_steps;
  const PipelineOptions options = BatchOptions(train_tokens_.get());
  if (!e.transfer) e.transfer = std::make_unique<DeviceTransfer>(device_);
  std::vector<Batch> micro;
  std::vector<double> weights;
  e.tokens = e.padded_len = e.packed_tokens = 0;
  for (int m = 0; m < count; ++m) {
    const auto [begin, end] = RankShard(shard_end - shard_begin, m, count);
    const BatchIndices indices(global.begin() + long(shard_begin + begin), global.begin() + long(shard_begin + end));
    Batch batch = CollateBatch(train_, *tokenizer_, indices, options.max_len, options.pin_memory, options.cache,
                               options.pad_lengths);
    PackOnHost(options.packing, &batch);
    e.tokens += batch.real_tokens;
    if (batch.packing.defined()) e.packed_tokens += batch.packing.index.size(0);
    if (batch.input_ids.dim() == 2) e.padded_len = std::max<int64_t>(e.padded_len, batch.input_ids.size(1));
    micro.push_back(e.transfer->ToDevice(std::move(batch)));
    weights.push_back(double(end - begin) * double(ranks_.world) / double(n));  // the reducer averages the ranks
  }
  timer.Mark(kH2d);
  StepControls controls;
  if (reducer_) reducer_->PrepareForBackward(false);  // a stop is rank 0's to decide, between steps
  const torch::Tensor loss = AccumulateGradients(micro.data(), micro.size(), weights.data(), controls, &timer);
  if (reducer_ && micro.back().size() == 0) reducer_->ContributeWithoutBackward();
  if (reducer_) reducer_->FinishBackward();  // the replica's share, on each of its ranks
  torch::Tensor counted = torch::tensor(
      {loss.item<double>() * double(shard_end - shard_begin), double(shard_end - shard_begin)}, torch::kDouble);
  if (ranks_.comm) ranks_.comm->AllReduce(counted, ReduceOp::kSum, "an elastic share's loss and examples");
  if (is_rank0()) AddShare(counted, sum);
  optimizer_->ZeroGrad();  // nothing of a step that does not commit stays
  e.members = members;
}

void Trainer::AddShare(const torch::Tensor& counted, std::vector<float>* sum) const {
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
  (*sum)[at] += static_cast<float>(counted[0].item<double>());
  (*sum)[at + 1] += static_cast<float>(counted[1].item<double>());
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
  record.packed_tokens = e.packed_tokens;
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
  const std::vector<RngState> rng = GatherRngStates();  // collective: every rank's, on rank 0
  if (!is_rank0()) return {};
  ScratchFile file(run_dir());
  SaveCheckpoint(file.path(), *model_, *optimizer_, *scaler_, progress_, rng);
  std::ifstream in(file.path(), std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void Trainer::LoadElasticState(const std::vector<uint8_t>& bytes) {
  ScratchFile file(run_dir());
  std::ofstream(file.path(), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
  progress_ = LoadCheckpoint(file.path(), *model_, *optimizer_, *scaler_, ranks_.rank, steps_per_epoch_).progress;
  if (is_rank0())
    LogInfo(StrFormat("healed from a live replica (%.1f MB): after step %ld, in epoch %ld", double(bytes.size()) / 1e6,
                      long(progress_.global_step), long(progress_.epoch + 1)));
}

// Rank 0 of the replica: the member of the quorum, driving the replica's other ranks.
Trainer::ElasticEnd Trainer::LeadElasticSteps(ElasticProgress& e, const ElasticRun& elastic) {
  Communicator* comm = ranks_.comm;
  ElasticModel view;
  view.gradient_size = FloatsOf(params_) + 2;
  view.accumulate = [this, &e, comm](int64_t step, int position, int members, std::vector<float>* sum) {
    if (comm) PassOrder(*comm, {ElasticCommand::kAccumulate, step, position, members});
    ElasticAccumulate(e, step, position, members, sum);
  };
  view.apply = [this, &e, comm](int64_t step, const std::vector<float>& sum) {
    if (comm) {
      PassOrder(*comm, {ElasticCommand::kApply, step});
      comm->Broadcast(torch::from_blob(const_cast<float*>(sum.data()), {long(sum.size())}, torch::kFloat), 0,
                      "an elastic step's summed shares");
    }
    ElasticApply(e, step, sum);
  };
  view.save = [this, comm] {
    if (comm) PassOrder(*comm, {ElasticCommand::kSave});
    return SaveElasticState();
  };
  view.load = [this, comm](const std::vector<uint8_t>& bytes) {
    if (comm) {
      PassOrder(*comm, {ElasticCommand::kLoad, static_cast<int64_t>(bytes.size())});
      comm->Broadcast(torch::from_blob(const_cast<uint8_t*>(bytes.data()), {long(bytes.size())}, torch::kUInt8), 0,
                      "a heal's state");
    }
    LoadElasticState(bytes);
  };
  view.stop_requested = [this] { return StopAsked(ranks_); };
  ElasticReplica replica(*elastic.listener, *elastic.link, std::move(view),
                         RingOptions{elastic.timeout_s, elastic.secret});
  ElasticEnd end;
  end.reached = replica.RunUntil(progress_.global_step, e.total_steps);
  end.stopped = replica.stopped();
  end.why = replica.last_failure();
  if (comm) PassOrder(*comm, {ElasticCommand::kEnd, end.reached, end.stopped ? 1 : 0});
  return end;
}

// The replica's other ranks: what rank 0 asks, until it says where the steps ended.
Trainer::ElasticEnd Trainer::FollowElasticSteps(ElasticProgress& e) {
  std::vector<float> sum(FloatsOf(params_) + 2);
  for (;;) {
    const ElasticOrder order = PassOrder(*ranks_.comm, {});
    switch (order.command) {
      case ElasticCommand::kAccumulate:
        ElasticAccumulate(e, order.a, static_cast<int>(order.b), static_cast<int>(order.c), &sum);
        break;
      case ElasticCommand::kApply:
        ranks_.comm->Broadcast(torch::from_blob(sum.data(), {long(sum.size())}, torch::kFloat), 0,
                               "an elastic step's summed shares");
        ElasticApply(e, order.a, sum);
        break;
      case ElasticCommand::kSave:
        SaveElasticState();
        break;
      case ElasticCommand::kLoad: {
        std::vector<uint8_t> bytes(static_cast<size_t>(order.a));
        ranks_.comm->Broadcast(torch::from_blob(bytes.data(), {long(bytes.size())}, torch::kUInt8), 0,
                               "a heal's state");
        LoadElasticState(bytes);
        break;
      }
      case ElasticCommand::kEnd:
        return {order.a, order.b != 0, ""};
      default:
        throw std::logic_error("an elastic replica's rank 0 sent an unknown command");
    }
  }
}

nlohmann::json Trainer::RunElastic(const ElasticRun& elastic) {
  if (ranks_.elastic_replicas < 1) throw InputError("an elastic replica needs the replicas at full strength set");
  if (graphs_) throw InputError("train.cuda_graph: elastic steps are not graphed; set it to false");
  if (is_rank0() != (elastic.link != nullptr && elastic.listener != nullptr))
    throw std::logic_error("an elastic replica's rank 0, and only it, reaches the quorum");
  const auto run_start = Clock::now();
  if (ranks_.comm) {  // the replica's ranks start alike, as Run's do
    SettleCheckpoints();
    BroadcastParameters();
    AgreeOnResumePoint();
  }
  ElasticProgress e;
  e.total_steps = TotalSteps();
  if (resume_from_ && !HasEpochToRun(e.total_steps)) return ShowFinishedRun();
  StartTrace();
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
  e.log = log ? &*log : nullptr;
  model_->train();
  try {
    const ElasticEnd end = is_rank0() ? LeadElasticSteps(e, elastic) : FollowElasticSteps(e);
    if (end.stopped) StopElastic(e);
    if (end.reached < e.total_steps)
      throw std::runtime_error(StrFormat("no quorum takes this replica any more, after step %ld%s", long(end.reached),
                                         end.why.empty() ? "" : (" (" + end.why + ")").c_str()));
  } catch (const ElasticEarlyStop&) {
  }
  WriteTrace();
  nlohmann::json summary = Summary(run_start);
  RestoreBestWeights(&summary);                   // collective
  EvaluateTest(log ? &*log : nullptr, &summary);  // collective
  if (log) SaveResults(*log, &summary);
  return summary;
}

}  // namespace trainyard
