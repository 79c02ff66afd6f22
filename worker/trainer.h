// Runs a `finetune` job: data, model, optimizer, the training loop with per-step
// timing, evaluation each epoch, checkpoints and resume, logs.
//
// Construction loads and checks every input the job names (datasets, tokenizer,
// initial weights, the checkpoint to resume from) before anything is written, so a bad
// input fails with InputError and leaves no runs/ output behind.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "data/length_bucket_sampler.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "proto/job_spec.h"
#include "worker/amp.h"
#include "worker/checkpoint.h"
#include "worker/models/bert.h"
#include "worker/optimizer.h"
#include "worker/run_log.h"

namespace trainyard {

// A problem with what the user gave us (exit code 2). what() is one line naming the
// job file, line and key, and the file at fault.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Trainer {
 public:
  // Throws InputError for bad inputs.
  explicit Trainer(JobSpec spec);
  ~Trainer();

  // Trains to the end (or to train.max_steps) and returns summary.json's content.
  // Throws std::runtime_error for a failure mid-run.
  nlohmann::json Run();

  std::string run_dir() const;
  BertForSequenceClassification& model() { return model_; }

 private:
  struct StepTimes;
  struct EpochTotals;

  void ChooseDevice();
  void LoadData();
  void BuildModel();
  void ResolveResume();
  void TrainEpoch(int64_t epoch, int64_t total_steps, RunLog& log);
  void TrainStep(struct Batch& batch, double lr, StepTimes* times);
  std::pair<double, double> Evaluate();
  void SaveCheckpointNow(const std::string& reason);
  double LrAt(int64_t step, int64_t total_steps) const;
  void Synchronize() const;

  JobSpec spec_;
  torch::Device device_{torch::kCPU};
  LabelSet labels_;
  TextDataset train_, dev_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<LengthBucketSampler> sampler_;
  BertForSequenceClassification model_{nullptr};
  std::vector<torch::Tensor> params_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradScaler> scaler_;
  std::optional<std::string> resume_from_;
  TrainProgress progress_;
  std::unique_ptr<EpochTotals> totals_;
  int64_t steps_per_epoch_ = 0;
};

}  // namespace trainyard
