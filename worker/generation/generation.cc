#include "worker/generation/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "worker/models/kv_cache.h"
#ifdef TRAINYARD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>

#include "worker/compiled/cuda_graph.h"
#endif

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

// Decode steps at fixed shapes over a cache at a write slot (generation.h): the
// tokens, positions, mask and slot are buffers that each step updates in place.
class FixedShapeDecoder {
 public:
  // After the prefill: `cache` holds the prompts (`keep` [B, P], false at padding),
  // whose last positions are `last_positions` [B, 1].
  FixedShapeDecoder(CausalLmImpl& model, KvCache& cache, const torch::Tensor& keep, const torch::Tensor& last_positions,
                    bool cuda_graph)
      : cuda_graph_(cuda_graph),
        ids_(torch::zeros_like(last_positions)),
        positions_(last_positions.clone()),
        keep_(torch::zeros({keep.size(0), cache.capacity()}, keep.options())),
        slot_(torch::full({1}, keep.size(1), last_positions.options())) {
    keep_.narrow(1, 0, keep.size(1)).copy_(keep);
    cache.UseWriteSlot(slot_);
    step_ = [&model, &cache, this] {
      return model.Step(ids_, positions_, keep_, cache, true).select(1, 0).to(torch::kFloat);
    };
  }
  // A captured graph's memory pool goes back to the device only when the allocator's
  // cache is emptied: without this, every batch's graph would keep its own.
  ~FixedShapeDecoder() {
#ifdef TRAINYARD_WITH_CUDA
    if (replay_) {
      replay_ = nullptr;
      c10::cuda::CUDACachingAllocator::emptyCache();
    }
#endif
  }
  FixedShapeDecoder(const FixedShapeDecoder&) = delete;  // step_ refers to this object
  FixedShapeDecoder& operator=(const FixedShapeDecoder&) = delete;

  torch::Tensor Feed(const torch::Tensor& tokens) {
    ids_.copy_(tokens.unsqueeze(1));
    positions_.add_(1);
    keep_.index_fill_(1, slot_, true);
    if (cuda_graph_ && !replay_) {
      const auto start = std::chrono::steady_clock::now();
      replay_ = Capture();
      capture_ms_ = MsBetween(start, std::chrono::steady_clock::now());
    }
    torch::Tensor logits = replay_ ? replay_() : step_();
    slot_.add_(1);
    return logits;
  }
  double capture_ms() const { return capture_ms_; }

 private:
  // The warm-up runs and the capture write this step's keys at the same slot, from the
  // same inputs: the cache holds what one run would have written.
  std::function<torch::Tensor()> Capture() {
#ifdef TRAINYARD_WITH_CUDA
    return CaptureCudaGraph(step_, ids_.device());
#else
    throw std::invalid_argument("CUDA-graph decoding needs a build with CUDA");
#endif
  }

  bool cuda_graph_;
  double capture_ms_ = 0;
  torch::Tensor ids_, positions_, keep_, slot_;
  std::function<torch::Tensor()> step_, replay_;
};

// The logits of the next token for every row, [B, vocab] float.
class NextLogits {
 public:
  NextLogits(CausalLmImpl& model, const PaddedPrompts& prompts, int64_t capacity, const GenerationOptions& options,
             torch::ScalarType cache_dtype)
      : model_(model),
        cache_dtype_(cache_dtype),
        decode_(options.decode),
        capacity_(capacity),
        ids_(prompts.ids),
        keep_(prompts.keep),
        positions_(prompts.positions) {
    if (options.use_cache) cache_.emplace(model.NewCache(ids_.size(0), capacity, cache_dtype));
  }

  torch::Tensor Prefill() {
    torch::Tensor logits = Run(ids_, positions_);
    if (cache_ && decode_ != DecodeMode::kGrowing)
      fixed_.emplace(model_, *cache_, keep_, positions_.narrow(1, positions_.size(1) - 1, 1),
                     decode_ == DecodeMode::kCudaGraph);
    return logits;
  }

  double capture_ms() const { return fixed_ ? fixed_->capture_ms() : 0.0; }

  // Feeds `tokens` [B] at each row's next position.
  torch::Tensor Feed(const torch::Tensor& tokens) {
    if (fixed_) return fixed_->Feed(tokens);
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
  DecodeMode decode_;
  int64_t capacity_;
  torch::Tensor ids_, keep_, positions_;
  std::optional<KvCache> cache_;
  std::optional<FixedShapeDecoder> fixed_;  // declared after cache_: it refers to it
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
  if (options.decode != DecodeMode::kGrowing && !options.use_cache)
    throw std::invalid_argument("fixed-shape and CUDA-graph decoding need the KV cache");
  if (options.decode == DecodeMode::kCudaGraph && !device.is_cuda())
    throw std::invalid_argument("CUDA-graph decoding needs a model on a CUDA device, not " + device.str());
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
    if (step == 0) {  // the first token, on the host (on a GPU: once the device has made it)
      chosen.back() = tokens.to(torch::kCPU);
      first = std::chrono::steady_clock::now();
    }
    if (!options.ignore_stop && stop.numel() > 0) {
      finished = finished.logical_or(torch::isin(tokens, stop));
      if (finished.all().item<bool>()) break;
    }
    if (step + 1 < options.max_new_tokens) logits = next.Feed(tokens);
  }
  for (torch::Tensor& t : chosen) t = t.to(torch::kCPU);
  result.tokens = torch::stack(chosen, 1);
  const auto end = std::chrono::steady_clock::now();
  result.first_token_ms = MsBetween(start, first);
  result.capture_ms = next.capture_ms();
  result.decode_ms = MsBetween(first, end) - result.capture_ms;
  return result;
}

}  // namespace trainyard
