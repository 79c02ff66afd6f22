// Runs a `finetune` job: data, model, optimizer, the training loop with per-step
// timing, evaluations (each epoch, every eval.every_steps, of a test split at the end),
// the best checkpoint and early stopping, checkpoints and resume, logs.
//
// Construction loads and checks every input the job names (datasets, tokenizer,
// initial weights, the checkpoint to resume from) before anything is written, so a bad
// input fails with InputError and leaves no runs/ output behind.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/spec/job_spec.h"
#include "common/trace_recorder.h"
#include "data/length_bucket_sampler.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "worker/comm/communicator.h"
#include "worker/comm/reducer.h"
#include "worker/jobs/checkpoint_sharing.h"
#include "worker/jobs/graphed_steps.h"
#include "worker/jobs/job_setup.h"
#include "worker/models/model.h"
#include "worker/report/mlflow_logger.h"
#include "worker/report/run_log.h"
#include "worker/train/amp.h"
#include "worker/train/batch_pipeline.h"
#include "worker/train/checkpoint.h"
#include "worker/train/optimizer.h"
#include "worker/train/step_profiler.h"
#include "worker/train/step_timer.h"

namespace trainyard {

class QuorumLink;
class RingListener;

// How an elastic replica reaches its peers: the quorum (QuorumLink, worker/elastic/
// quorum_link.h) and its ring's listening socket, with the ring's deadline and the
// secret it uses until a quorum brings the attempt's own.
struct ElasticRun {
  QuorumLink* link = nullptr;
  RingListener* listener = nullptr;
  double timeout_s = 300;
  std::string secret;
};

class Trainer {
 public:
  // Throws InputError for bad inputs. Makes no collective call, so ranks can agree on
  // whether all of them got this far before Run().
  Trainer(JobSpec spec, RankContext ranks);
  ~Trainer();

  // Trains to the end (or to train.max_steps) and returns summary.json's content.
  // Collective over the ranks: parameters are first broadcast from rank 0. Rank 0 writes
  // runs/<job>/; checkpoints go to every host's own disk (checkpoint_sharing.h). Throws
  // std::runtime_error for a failure mid-run.
  nlohmann::json Run();

  // Trains as one replica of an elastic job (Note [Elastic finetune] in
  // trainer_elastic.cc): the steps, their evaluations, rows and checkpoints as Run's,
  // each step's gradient summed over the replicas of its quorum and applied only once
  // the quorum commits it. The replica is this job's ranks (ranks.elastic_replicas
  // set): rank 0, with `elastic`'s link and listener, is the quorum's member, and the
  // others (with neither) follow it. Throws std::runtime_error when no quorum takes it
  // any more, InputError for a job elastic steps cannot run.
  nlohmann::json RunElastic(const ElasticRun& elastic);

  std::string run_dir() const;
  bool is_rank0() const { return ranks_.rank == 0; }
  ModelImpl& model() { return *model_; }

 private:
  struct PendingStep;
  struct EpochTotals;
  class StepLog;

  // trainer.cc: inputs, model, the loop.
  void LoadData();
  void BuildModel();
  int64_t TotalSteps() const;
  // The epochs that have steps to train: train.max_steps may end the run early.
  int64_t EpochsToRun(int64_t total_steps) const;
  // Whether an epoch is left to train, or to close: one whose steps are all done but
  // which has no row yet (a stop after its last step, with a checkpoint there) is still
  // evaluated, logged and checkpointed.
  bool HasEpochToRun(int64_t total_steps) const;
  // One epoch's training, evaluation, epoch row and checkpoint.
  void TrainAndEvaluateEpoch(int64_t total_steps, RunLog* log);
  // After an epoch's last step (or the run's): its evaluation, row and checkpoint, and
  // the pool told of the row. Collective.
  void CloseEpoch(int64_t epoch, int64_t total_steps, RunLog* log);
  // After a step: its flush, the evaluation and checkpoint due, debug.step_pause_ms.
  // Returns false where early stopping ends the run. Collective.
  bool AfterStep(StepLog& steps, RunLog* log);
  void TrainEpoch(int64_t epoch, int64_t total_steps, RunLog* log);
  // The rank's micro-batches of the epoch's steps left, in order, gradient_accumulation_steps
  // of them a step, and each one's loss weight.
  struct MicroPlan {
    std::vector<BatchIndices> batches;
    std::vector<double> loss_weights;
  };
  MicroPlan PlanMicroBatches(int64_t epoch) const;
  // The batch pipeline's options for a split whose token ids `tokens` caches; graphed
  // steps pad to a few lengths.
  PipelineOptions BatchOptions(TokenCache* tokens) const;
  // Up to `count` batches from the pipeline (fewer at its end).
  static std::vector<Batch> NextMicroBatches(BatchPipeline& pipeline, size_t count);
  // A step trained: its number, examples and tokens, and the epoch's progress.
  void CountStep(const std::vector<Batch>& micro, PendingStep* step);
  // One optimizer step over the rank's micro-batches of it (one without gradient
  // accumulation), each with its loss weight.
  void TrainStep(std::vector<Batch>& micro, const double* loss_weights, double lr, StepTimer& timer, PendingStep* step);
  StepResult StepBody(Batch* micro, size_t count, const double* loss_weights, const StepControls& controls,
                      StepTimer* timer);
  // Forward and backward of each micro-batch, the gradients adding up (the reducer
  // all-reduces them in the last backward). Returns the rank's loss: its micro-batch's
  // mean where one had examples, the mean over its examples where several had, else 0.
  torch::Tensor AccumulateGradients(Batch* micro, size_t count, const double* loss_weights,
                                    const StepControls& controls, StepTimer* timer);
  // Examples in an optimizer step: batch_size x ranks x gradient_accumulation_steps
  // (an elastic replica's: x the replicas at full strength, however many there are).
  int64_t GlobalBatch() const;
  void PlantDebugInf(const StepControls& controls);
  // train.cuda_graph against the device and the communicator: whether steps are graphed.
  // Throws InputError where `true` cannot be honoured.
  bool WantsGraphs() const;
  // trainer_eval.cc: evaluations, the best one, early stopping.
  // One evaluation of a split ("eval": the dev set, "test"): its figures in report
  // order, "<split>_loss" first, then the metrics eval.metrics names; empty for a split
  // without examples.
  struct Evaluation {
    std::string split;
    int64_t step = 0;
    std::vector<std::pair<std::string, double>> metrics;
    double accuracy = 0;  // also where eval.metrics leaves it out: the epoch table shows it
    double seconds = 0;
    size_t examples = 0;
    bool bettered = false;  // it became the best of checkpoint.best_metric
    double Get(const std::string& name) const;
  };
  // Collective: the split's mean loss and metrics over every rank's share of it.
  Evaluation Evaluate(const TextDataset& data, TokenCache* tokens, const std::string& split);
  std::vector<std::pair<std::string, double>> ReportedMetrics(const std::vector<double>& sums,
                                                              const std::string& split) const;
  torch::Tensor EvaluationSums(const Batch& batch);
  // Collective: the dev set's evaluation at this step. The first at a step is recorded
  // (evals.jsonl, TensorBoard, MLflow) and judged; another at the same step (an epoch
  // end that eval.every_steps also hit, a resume there) is not.
  Evaluation EvaluateDev(RunLog* log);
  // Whether eval.every_steps asks for an evaluation at this step that was not made.
  bool EvaluationDue() const;
  // Collective: the evaluation that is due, and the checkpoint that a new best or
  // checkpoint.every_steps (`checkpoint_due`) asks for.
  void EvaluateAndCheckpointIfDue(RunLog* log, bool checkpoint_due);
  // checkpoint.best_metric: whether `e` betters the best (then it becomes the best), and
  // train.early_stopping's count of evaluations without a gain.
  bool Judge(const Evaluation& e);
  bool StoppedEarly() const;
  nlohmann::json EvaluationLine(const Evaluation& e) const;
  // Collective, at the end: the best evaluation's weights into the model (from its
  // checkpoint on rank 0's host, broadcast), where they are not the last step's.
  void RestoreBestWeights(nlohmann::json* summary);
  // Collective, at the end: eval.test's evaluation, into evals.jsonl and the summary.
  void EvaluateTest(RunLog* log, nlohmann::json* summary);
  bool causal_lm() const;
  static constexpr int64_t kIgnoredTarget = -100;
  static torch::Tensor NextTokenTargets(const Batch& batch);
  torch::Tensor TaskLoss(const torch::Tensor& logits, const Batch& batch,
                         torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction) const;
  double LrAt(int64_t step, int64_t total_steps) const;

  // trainer_elastic.cc: one replica of an elastic job.
  struct ElasticProgress;
  // Member `position` of `members`' share of step `step`'s gradient, added to `sum`
  // with its loss sum and examples after the gradients.
  void ElasticAccumulate(ElasticProgress& e, int64_t step, int position, int members, std::vector<float>* sum);
  // The summed shares into the gradients, the optimizer step, and the step's records,
  // evaluations, checkpoints and, after an epoch's last step, its row.
  void ElasticApply(ElasticProgress& e, int64_t step, const std::vector<float>& sum);
  // The epoch's step log, made at its first step.
  void OpenElasticSteps(ElasticProgress& e, int64_t epoch);
  // Throws JobStopped, or JobPreempted once a checkpoint keeps the place.
  [[noreturn]] void StopElastic(ElasticProgress& e);
  // The replica's whole state as a checkpoint's bytes (on rank 0; collective), and its
  // loading on each rank (a heal).
  std::vector<uint8_t> SaveElasticState();
  void LoadElasticState(const std::vector<uint8_t>& bytes);
  // Adds the replica's share (its gradients, then `counted`: its loss sum and examples)
  // to `sum`.
  void AddShare(const torch::Tensor& counted, std::vector<float>* sum) const;
  // Note [Elastic replica of several ranks]: rank 0's steps as the quorum's member,
  // and the other ranks' following them; where the steps ended.
  struct ElasticEnd;
  ElasticEnd LeadElasticSteps(ElasticProgress& e, const ElasticRun& elastic);
  ElasticEnd FollowElasticSteps(ElasticProgress& e);

  // trainer_consistency.cc: the ranks in step.
  // The ranks' maximum of found_inf, on the device (MAX-reduced where there are ranks).
  torch::Tensor AgreeOnFoundInf(torch::Tensor local_found_inf);
  void CheckConsistency();
  void BroadcastParameters();

  // trainer_resume.cc: checkpoints and resume.
  void ResolveResume();
  // Collective: who writes checkpoints, and the resume point every rank takes, loading a
  // checkpoint another host sent where its own folder lacked it (Note [Node-local
  // checkpoints] in checkpoint_sharing.h).
  void SettleCheckpoints();
  void AgreeOnResumePoint();
  void LoadResumeCheckpoint(const std::string& path);
  InputError NoValidCheckpoint(size_t rejected) const;
  bool WritesCheckpoints() const { return writers_ ? writers_->mine : is_rank0(); }
  // Collective: every rank calls it at the same step; the writers (rank 0 alone, on one
  // host or shared storage) write the file.
  void SaveCheckpointNow(const std::string& reason);
  // After the ranks agreed to stop: whether the stop is a preemption (they then
  // checkpoint). Collective in a pool.
  bool StopIsPreemption();
  // Every rank's RNG states, on every rank, as bytes (Note [Resume] 1).
  std::vector<RngState> GatherRngStates();
  // The writers, once the ranks agreed on the resume point: rename the checkpoints
  // ResolveResume rejected to <file>.rejected.
  void SetAsideRejected();
  // The writers, before the first step: SetAsideRejected, and a fresh run removes an
  // older run's checkpoints.
  void PrepareCheckpointFolder();

  // trainer_outputs.cc: what the run leaves behind.
  EpochRow MakeEpochRow(int64_t epoch, const Evaluation& eval, int64_t total_steps);
  void StartTrace();
  // Each rank writes its spans; after a barrier rank 0 merges them into trace.json.
  void WriteTrace();
  MlflowOptions MlflowOptionsFor() const;
  // Rank 0: MLflow, the opening lines, and the epoch rows of the attempts before this one.
  void OpenRunLog(RunLog& log);
  // A rerun of a finished run (resume: auto after its last step) trains nothing and
  // leaves every file the run wrote as it was. Rank 0 shows the epoch table, hands the
  // epochs to a pool's hooks as a resumed attempt does, and returns the run's summary.
  nlohmann::json ShowFinishedRun() const;
  // Rank 0: the epochs before this attempt to a pool's hooks, which keep those it lacks.
  void HandEpochsToPool(const RunLog& log) const;
  void LogRunStart() const;
  nlohmann::json Summary(Clock::time_point run_start) const;
  // Rank 0: the model (or adapter), and summary.json.
  std::string SaveModel(nlohmann::json* summary);
  void SaveResults(RunLog& log, nlohmann::json* summary);

  JobSpec spec_;
  RankContext ranks_;
  torch::Device device_{torch::kCPU};
  LabelSet labels_;
  TextDataset train_, dev_, test_;
  std::unique_ptr<Tokenizer> tokenizer_;
  // Each example's ids, encoded in the first epoch (or evaluation) and reused after.
  static constexpr size_t kTokenCacheBytes = size_t(256) << 20;
  std::unique_ptr<TokenCache> train_tokens_, dev_tokens_, test_tokens_;
  std::optional<Evaluation> last_eval_;  // the newest dev evaluation of this process
  std::unique_ptr<LengthBucketSampler> sampler_;
  Model model_;
  LoraSummary lora_;  // with model.lora: what was adapted
  std::vector<torch::Tensor> params_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<GraphedSteps> graphs_;      // train.cuda_graph, where it applies
  std::optional<CheckpointWriters> writers_;  // with several ranks
  std::optional<std::string> resume_from_;
  std::vector<std::string> rejected_;  // newer checkpoints than resume_from_ that failed to load
  TrainProgress progress_;
  std::unique_ptr<EpochTotals> totals_;
  std::unique_ptr<StepProfiler> profiler_;  // log.profile_steps
  std::unique_ptr<TraceRecorder> trace_;    // log.trace
  int64_t steps_per_epoch_ = 0;
  int64_t consistency_checks_ = 0;
};

}  // namespace trainyard
