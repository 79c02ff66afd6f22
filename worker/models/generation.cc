#include "worker/models/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

#include "worker/models/kv_cache.h"

namespace trainyard {
namespace {

double MsBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Left-padded prompts: ids, keep (true at real tokens) and HF's position ids.
struct PaddedPrompts {
  torch::Tensor ids, keep, positions;
};

PaddedPrompts LeftPad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  const auto batch = int64_t(prompts.size()), width = int64_t(longest);
  torch::Tensor ids = torch::full({batch, width}, pad_id, torch::kLong);
  torch::Tensor keep = torch::zeros({batch, width}, torch::kBool);
  for (int64_t row = 0; row < batch; ++row) {
    const auto& p = prompts[size_t(row)];
    const int64_t start = width - int64_t(p.size());
    ids[row].narrow(0, start, int64_t(p.size())).copy_(torch::tensor(p, torch::kLong));
    keep[row].narrow(0, start, int64_t(p.size())).fill_(true);
  }
  torch::Tensor positions = keep.to(torch::kLong).cumsum(1) - 1;
  positions.masked_fill_(keep.logical_not(), 1);
  return {ids, keep, positions};
}

torch::Tensor TopK(const torch::Tensor& logits, int64_t k) {
  if (k <= 0 || k >= logits.size(-1)) return logits;
  torch::Tensor kth = std::get<0>(logits.topk(k, -1)).narrow(-1, k - 1, 1);
  return logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
}

// HF's TopPLogitsWarper: drop the least likely tokens whose total probability is at
// most 1 - top_p, always keeping the most likely one.
torch::Tensor TopP(const torch::Tensor& logits, double top_p) {
  if (top_p >= 1.0) return logits;
  auto [sorted, order] = logits.sort(-1, /*descending=*/false);
  torch::Tensor remove = sorted.softmax(-1).cumsum(-1) <= (1.0 - top_p);
  remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);
  return logits.masked_fill(remove.scatter(-1, order, remove), -std::numeric_limits<float>::infinity());
}

// The logits of the next token for every row, [B, vocab] float.
class NextLogits {
 public:
  NextLogits(CausalLmImpl& model, const PaddedPrompts& prompts, int64_t capacity, const GenerationOptions& options,
             torch::ScalarType cache_dtype)
      : model_(model),
        cache_dtype_(cache_dtype),
        capacity_(capacity),
        ids_(prompts.ids),
        keep_(prompts.keep),
        positions_(prompts.positions) {
    if (options.use_cache) cache_.emplace(model.NewCache(ids_.size(0), capacity, cache_dtype));
  }

  torch::Tensor Prefill() { return Run(ids_, positions_); }

  // Feeds `tokens` [B] at each row's next position.
  torch::Tensor Feed(const torch::Tensor& tokens) {
    torch::Tensor next_position = positions_.narrow(1, positions_.size(1) - 1, 1) + 1;
    ids_ = torch::cat({ids_, tokens.unsqueeze(1)}, 1);
    positions_ = torch::cat({positions_, next_position}, 1);
    keep_ = torch::cat({keep_, torch::ones_like(tokens, torch::TensorOptions(torch::kBool)).unsqueeze(1)}, 1);
    return Run(tokens.unsqueeze(1), next_position);
  }

 private:
  torch::Tensor Run(const torch::Tensor& new_ids, const torch::Tensor& new_positions) {
    if (cache_) return model_.Step(new_ids, new_positions, keep_, *cache_, true).select(1, 0).to(torch::kFloat);
    KvCache fresh = model_.NewCache(ids_.size(0), capacity_, cache_dtype_);  // recompute everything
    return model_.Step(ids_, positions_, keep_, fresh, true).select(1, 0).to(torch::kFloat);
  }

  CausalLmImpl& model_;
  torch::ScalarType cache_dtype_;
  int64_t capacity_;
  torch::Tensor ids_, keep_, positions_;
  std::optional<KvCache> cache_;
};

}  // namespace

torch::Tensor ChooseTokens(const torch::Tensor& logits, const GenerationOptions& options, at::Generator& generator) {
  if (!options.sample) return logits.argmax(-1);
  torch::Tensor scaled = TopP(TopK(logits / options.temperature, options.top_k), options.top_p);
  // Drawn on the CPU, so a seed gives the same text on every device.
  torch::Tensor probs = scaled.softmax(-1).to(torch::kCPU);
  return torch::multinomial(probs, 1, false, generator).squeeze(1).to(logits.device());
}

GenerationResult Generate(CausalLmImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, torch::ScalarType cache_dtype) {
  const PaddedPrompts padded = LeftPad(prompts, options.pad_id);
  const int64_t capacity = padded.ids.size(1) + options.max_new_tokens;
  if (capacity > model.info().max_sequence)
    throw std::invalid_argument("a prompt of " + std::to_string(padded.ids.size(1)) + " tokens plus max_new_tokens " +
                                std::to_string(options.max_new_tokens) + " exceeds the model's " +
                                std::to_string(model.info().max_sequence) + " positions");
  const torch::Device device = model.parameters().front().device();
  PaddedPrompts on_device{padded.ids.to(device), padded.keep.to(device), padded.positions.to(device)};
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  torch::InferenceMode inference;
  const auto start = std::chrono::steady_clock::now();
  NextLogits next(model, on_device, capacity, options, cache_dtype);
  torch::Tensor logits = next.Prefill();
  torch::Tensor stop = torch::tensor(options.stop_ids, torch::kLong).to(device);
  torch::Tensor finished = torch::zeros({padded.ids.size(0)}, torch::TensorOptions(torch::kBool).device(device));
  std::vector<torch::Tensor> chosen;
  GenerationResult result;
  auto first = start;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    torch::Tensor tokens = ChooseTokens(logits, options, generator).masked_fill(finished, options.pad_id);
    chosen.push_back(tokens);
    if (step == 0) first = std::chrono::steady_clock::now();
    if (!options.ignore_stop && stop.numel() > 0) {
      finished = finished.logical_or(torch::isin(tokens, stop));
      if (finished.all().item<bool>()) break;
    }
    if (step + 1 < options.max_new_tokens) logits = next.Feed(tokens);
  }
  result.tokens = torch::stack(chosen, 1).to(torch::kCPU);
  const auto end = std::chrono::steady_clock::now();
  result.first_token_ms = MsBetween(start, first);
  result.decode_ms = MsBetween(first, end);
  return result;
}

}  // namespace trainyard
