// Runs a `generate` job: continues every prompt of a text file with a causal LM
// (greedy or sampled, generation.h), in batches of left-padded prompts, and writes one
// JSON line per prompt: the new tokens, their text and whether a stop token ended it.
// The summary reports time to first token and decoding tokens/s, the two numbers
// generation benchmarks quote, after an untimed warm-up on the first batch. One rank.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "worker/jobs/job_setup.h"
#include "worker/models/generation.h"

namespace trainyard {

class GenerateRunner {
 public:
  // Throws InputError for bad inputs: a model that is not a causal LM, an empty prompt,
  // a prompt that with max_new_tokens exceeds the model's positions, a stop string that
  // is not one token.
  GenerateRunner(JobSpec spec, RankContext ranks);
  nlohmann::json Run();
  std::string run_dir() const;

 private:
  void ReadPrompts();
  void ChooseStopTokens();
  std::string Completion(const std::vector<int64_t>& tokens, bool* stopped) const;
  void WarmUp(GenerationOptions options, torch::ScalarType cache_dtype);

  JobSpec spec_;
  RankContext ranks_;
  torch::Device device_{torch::kCPU};
  std::unique_ptr<Tokenizer> tokenizer_;
  Model model_;
  CausalLmImpl* lm_ = nullptr;
  std::vector<std::string> prompts_;
  std::vector<std::vector<int64_t>> prompt_ids_;
  std::vector<int64_t> stop_ids_;
};

}  // namespace trainyard
