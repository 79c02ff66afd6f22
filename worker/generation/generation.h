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
//
// Decode steps run in one of three ways (DecodeMode). Growing: each step attends over
// the positions cached so far, so its shapes grow by one. Fixed shape: the cache takes
// each step's keys at a write slot held in a device tensor and every step attends over
// the whole preallocated cache, the positions not yet written masked out; inputs,
// mask and slot live in buffers updated in place. Every step then has the same shapes
// and addresses, which is what CUDA-graph capture needs. CUDA graph: the fixed-shape
// step captured once, at the first decode step, and replayed for every step after,
// so that a step costs one graph launch instead of a few hundred kernel launches.
// Fixed shape without a graph is the CPU-testable form of the same computation.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "worker/models/model.h"

namespace trainyard {

enum class DecodeMode { kGrowing, kFixedShape, kCudaGraph };

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
  DecodeMode decode = DecodeMode::kGrowing;  // fixed shape and CUDA graph need the cache
};

struct GenerationResult {
  torch::Tensor tokens;       // [B, n] int64 on the CPU, n <= max_new_tokens; pad after a row's stop token
  double first_token_ms = 0;  // prefill and the first token (on the host)
  double decode_ms = 0;       // the remaining n - 1 steps
  double capture_ms = 0;      // capturing the decode step's CUDA graph, in neither of the above
};

// REQUIRES: prompts non-empty, each prompt non-empty. Throws std::invalid_argument when
// the longest prompt plus max_new_tokens exceeds the model's positions, or when the
// decode mode cannot run (a CUDA graph off CUDA, a fixed shape without the cache).
GenerationResult Generate(CausalLmImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, torch::ScalarType cache_dtype = torch::kFloat);

// The next token of each row from last-position logits [B, vocab] (float): argmax, or
// a draw after temperature, top-k and top-p, in HF's order. Returns [B] int64 on the
// logits' device.
torch::Tensor ChooseTokens(const torch::Tensor& logits, const GenerationOptions& options, at::Generator& generator);

}  // namespace trainyard
