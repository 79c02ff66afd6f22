// The worker's input pipeline: background threads tokenize and collate the batches of
// an epoch plan ahead of the trainer, into (optionally pinned) host tensors, and the
// trainer takes them in plan order. See data/prefetch_queue.h for the ordering and
// memory bound.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "data/length_bucket_sampler.h"
#include "data/prefetch_queue.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "worker/models/model.h"
#include "worker/models/token_index.h"

namespace trainyard {

struct Batch {
  torch::Tensor input_ids;       // [B, L] int64, padded to the batch's longest text
  torch::Tensor attention_mask;  // [B, L] int64, 1 = real token
  torch::Tensor labels;          // [B] int64
  int64_t real_tokens = 0;
  TokenPacking packing;  // the real tokens as the host found them (PackOnHost); undefined: none
  int64_t size() const { return labels.size(0); }
};

// The model's logits for a batch: through the host's packing where the batch has one
// (ModelImpl::ForwardPacked), else forward().
torch::Tensor ForwardBatch(ModelImpl& model, const Batch& batch);

// Which batches the host packs for an encoder on a GPU (worker/models/token_index.h):
// none under kNever, each under kAlways, and under kAuto those that are a tenth or more
// padding (TokenIndex::Worth). for_graphs rounds the packed token counts up to
// GraphTokenGranule, so that CUDA-graphed steps see few shapes.
struct HostPacking {
  Unpadding policy = Unpadding::kNever;
  bool for_graphs = false;
};
// Sets batch->packing from its host mask as `how` says (pinned when the mask is).
void PackOnHost(const HostPacking& how, Batch* batch);

// The token ids of a dataset's examples, each encoded once, on first use, and then reused
// by every later epoch and evaluation pass. Encoding is host work that competes with the
// step's compute threads for the cores (profiled: a batch of 32 long texts took ~25 ms
// of WordPiece on this 2-core machine, a quarter of a tiny BERT step), and the texts do
// not change between epochs. Ids beyond `budget_bytes` are not kept: those examples are
// encoded every time, so memory stays bounded for any dataset. Thread-safe.
class TokenCache {
 public:
  // `data` and `tokenizer` must outlive the cache; every id list is cut at `max_len`.
  TokenCache(const TextDataset& data, const Tokenizer& tokenizer, int max_len, size_t budget_bytes);
  TokenCache(const TokenCache&) = delete;
  TokenCache& operator=(const TokenCache&) = delete;

  std::vector<int32_t> Ids(int32_t example);
  int max_len() const { return max_len_; }
  size_t cached_bytes() const { return bytes_.load(); }

 private:
  const TextDataset& data_;
  const Tokenizer& tokenizer_;
  const int max_len_;
  const size_t budget_bytes_;
  std::unique_ptr<std::once_flag[]> once_;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<char> kept_;  // written inside the example's call_once, read after it
  std::atomic<size_t> bytes_{0};
};

// Tokenizes and pads the examples of one batch, through `cache` when given (it must be
// the cache of `data` and `tokenizer` at `max_len`). The batch is padded to its longest
// text, or, with `pad_lengths` (ascending, the last >= every text), up to the first of
// them that holds it. Thread-safe.
Batch CollateBatch(const TextDataset& data, const Tokenizer& tokenizer, const BatchIndices& indices, int max_len,
                   bool pin_memory, TokenCache* cache = nullptr, const std::vector<int>& pad_lengths = {});

// `count` padded lengths spaced evenly up to `max_len`, each rounded up to a multiple of 8
// (tensor-core tiles) and the last exactly `max_len`; empty for count 0. A CUDA-graphed
// step needs a graph per batch shape, so batches padded to a few lengths keep the graphs
// few, at the cost of at most max_len/count padding tokens a row.
std::vector<int> PadBucketLengths(int count, int max_len);

struct PipelineOptions {
  size_t prefetch_batches = 8;  // 0: collate on the trainer's thread when asked
  size_t threads = 2;
  bool pin_memory = false;  // page-locked host tensors for async H2D copies
  int max_len = 128;
  TokenCache* cache = nullptr;   // optional; must outlive the pipeline
  std::vector<int> pad_lengths;  // see CollateBatch; empty: each batch to its longest text
  HostPacking packing;           // which batches PackOnHost packs
  // Called on the loader thread before batch `i` is collated. Lets tests slow the reader.
  std::function<void(size_t)> before_collate;
};

class BatchPipeline {
 public:
  // `data` and `tokenizer` must outlive the pipeline. Threads start at once.
  BatchPipeline(const TextDataset& data, const Tokenizer& tokenizer, std::vector<BatchIndices> batches,
                const PipelineOptions& options);
  // Blocks until the next batch in plan order is ready; nullopt at the end.
  std::optional<Batch> Next() { return queue_->Next(); }
  size_t size() const { return batches_.size(); }

 private:
  std::vector<BatchIndices> batches_;
  std::unique_ptr<PrefetchQueue<Batch>> queue_;
};

}  // namespace trainyard
