// The Trainer's private step records, shared by its files (trainer.cc runs the loop,
// trainer_elastic.cc an elastic replica's, trainer_outputs.cc turns the records into
// epoch rows and traces). Not for other code.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "worker/jobs/trainer.h"
#include "worker/report/run_log.h"
#include "worker/train/step_timer.h"

namespace trainyard {

// The parts of a step that StepTimer measures (device time on CUDA), in order; the
// data wait before them is host time.
enum TimedPart { kH2d, kForward, kBackward, kComm, kOptimizer, kNumTimedParts };
static_assert(kNumTimedParts + 1 == kNumStepParts, "the epoch table's parts are the data wait and the timed parts");

// A step whose loss and timings may still be on the device. Read in FlushSteps.
struct Trainer::PendingStep {
  int64_t step = 0;  // global step, 1-based
  int64_t examples = 0, tokens = 0, padded_len = 0;
  int64_t packed_tokens = 0;  // the tokens computed of batches packed on the host (with filler)
  double lr = 0, wait_ms = 0;
  torch::Tensor loss;       // scalar, detached
  torch::Tensor found_inf;  // [1], under loss scaling: nonzero when the step was skipped
  torch::Tensor scale;      // [1], under loss scaling: the scale after the step
  int64_t begin_us = 0;     // when its wait for data began (the trace's clock)
  // Gradient buckets all-reduced while backward still ran (Reducer::launched_in_backward);
  // -1 without a reducer or for a graphed step.
  int64_t buckets_in_backward = -1;
  int replicas = 0;  // an elastic step's: the members of the quorum that took it
};

// Sums over the steps of the epoch in progress in this process (timings are not
// carried across a resume; losses are, through TrainProgress).
struct Trainer::EpochTotals {
  double wait = 0, parts[kNumTimedParts] = {};
  int64_t steps = 0, samples = 0;
  Clock::time_point start = Clock::now();
};

// The progress line, steps.jsonl and the epoch sums see a step only once its loss and
// timings have been read from the device, which happens in batches (see StepTimer).
class Trainer::StepLog {
 public:
  // The progress line counts the steps this epoch runs (train.max_steps may end it
  // early) out of the epochs the run has, from where a resumed epoch left off.
  StepLog(Trainer& trainer, int64_t epoch, int64_t total_steps, RunLog* log);

  StepTimer& timer() { return timer_; }
  void Add(PendingStep step) { pending_.push_back(std::move(step)); }
  // Reads every pending step (one wait for the device on CUDA) and, in a pool, the
  // ranks' stop votes of the newest one. Throws JobStopped on every rank alike if any
  // rank voted to stop.
  void Flush();
  void Finish();

 private:
  // What a step's record held on the device, read.
  struct StepValues {
    double loss;
    bool skipped;
    double loss_scale;  // 0 without loss scaling
  };

  void Account(const PendingStep& p, const StepValues& v, const std::vector<double>& ms);
  void LogStep(const PendingStep& p, const StepValues& v, double step_ms, double comm_ms);
  void Trace(const PendingStep& p, const std::vector<double>& ms);

  Trainer& t_;
  int64_t epoch_;
  RunLog* log_;
  StepTimer timer_;
  ProgressLine line_;
  std::vector<PendingStep> pending_;
};

}  // namespace trainyard
