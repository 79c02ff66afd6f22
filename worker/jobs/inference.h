// Runs an `inference` job: predicts a label and per-class logits for every text of a
// dataset file, in batches taken in file order or sorted by length (which pads far
// less when lengths vary), and writes the predictions in input order either way.
// `sort_by_length: both` runs the two orders, checks that they predict the same, and
// reports both throughputs. With several ranks each takes a contiguous shard of the
// file and rank 0 gathers and writes.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "worker/compiled/aoti_package.h"
#include "worker/jobs/job_setup.h"

namespace trainyard {

class InferenceRunner {
 public:
  // Throws InputError for bad inputs.
  InferenceRunner(JobSpec spec, RankContext ranks);
  nlohmann::json Run();
  std::string run_dir() const;

 private:
  struct Pass {
    torch::Tensor logits;  // [texts, labels], float, input order (this rank's shard)
    double seconds = 0;
    int64_t tokens = 0, padded_tokens = 0;
  };

  Pass Predict(bool sort_by_length);
  torch::Tensor GatherLogits(const torch::Tensor& mine) const;
  void WritePredictions(const torch::Tensor& logits) const;

  JobSpec spec_;
  RankContext ranks_;
  torch::Device device_{torch::kCPU};
  LabelSet labels_;
  TextDataset input_;
  size_t shard_begin_ = 0, shard_end_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  Model model_;
  std::unique_ptr<AotiPackage> aoti_;  // inference.mode: aoti
};

}  // namespace trainyard
