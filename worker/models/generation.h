// Text generation with a causal LM: greedy decoding or sampling (temperature, top-k,
// top-p) from a seeded generator, stop tokens, max new tokens, and batches of prompts of
// different lengths.
//
// The loop, as Hugging Face's generate() runs it, so that greedy output is the same:
//  1. Prompts are left-padded to the longest. Position ids count each row's real
//     tokens from 0 (padding gets 1, and is masked anyway), so a short prompt is
//     positioned as if it were alone.
//  2. Prefill: one Step over the padded prompts fills the KV cache (preallocated for
//     prompt + max_new_tokens) and gives the first token's logits.
//  3. Decode: each step feeds the chosen tokens at the next position and reads the
//     logits of that position only. A row that emitted a stop token gets the pad id
//     from then on; the loop ends when every row has stopped or after max_new_tokens.
// Without the cache (use_cache false) every step recomputes all positions from
// scratch, the reference the cached path is tested against.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "worker/models/model.h"

namespace trainyard {

struct GenerationOptions {
  int64_t max_new_tokens = 32;
  bool sample = false;            // false: greedy (argmax)
  double temperature = 1.0;       // sampling: logits / temperature
  int64_t top_k = 0;              // sampling: keep the k most likely tokens; 0 = all
  double top_p = 1.0;             // sampling: keep the smallest set with this much probability; 1 = all
  uint64_t seed = 0;              // sampling: the generator's seed (same seed, same text)
  std::vector<int64_t> stop_ids;  // a row ends after emitting one of these
  bool ignore_stop = false;       // benchmarks: always generate max_new_tokens
  int64_t pad_id = 0;             // fills prompts' left padding and stopped rows
  bool use_cache = true;
};

struct GenerationResult {
  torch::Tensor tokens;       // [B, n] int64 on the CPU, n <= max_new_tokens; pad after a row's stop token
  double first_token_ms = 0;  // prefill and the first token
  double decode_ms = 0;       // the remaining n - 1 steps
};

// REQUIRES: prompts non-empty, each prompt non-empty. Throws std::invalid_argument when
// the longest prompt plus max_new_tokens exceeds the model's positions.
GenerationResult Generate(CausalLmImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, torch::ScalarType cache_dtype = torch::kFloat);

// The next token of each row from last-position logits [B, vocab] (float): argmax, or
// a draw after temperature, top-k and top-p, in HF's order. Returns [B] int64 on the
// logits' device.
torch::Tensor ChooseTokens(const torch::Tensor& logits, const GenerationOptions& options, at::Generator& generator);

}  // namespace trainyard
