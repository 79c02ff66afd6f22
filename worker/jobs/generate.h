// Runs a `generate` job: continues every prompt of a text file with a causal LM
// (greedy or sampled, generation.h), in batches of left-padded prompts, and writes one
// JSON line per prompt: the new tokens, their text and whether a stop token ended it.
// The summary reports time to first token and decoding tokens/s, the two numbers
// generation benchmarks quote, after an untimed warm-up on the first batch. One rank.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "worker/generation/generation.h"
#include "worker/jobs/job_setup.h"

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
  GenerationOptions Options() const;
  // Sums over the batches, for the summary.
  struct GenerateStats {
    std::vector<double> first_token_ms;  // one per batch
    double decode_ms = 0, decode_tokens = 0, capture_ms = 0;
    int64_t new_tokens = 0;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();  // of the timed batches
  };
  // Generates for prompts [begin, end): their generations.jsonl lines.
  std::string GenerateBatch(size_t begin, size_t end, const GenerationOptions& options, torch::ScalarType cache_dtype,
                            GenerateStats* stats);

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
