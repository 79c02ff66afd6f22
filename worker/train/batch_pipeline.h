// The worker's input pipeline: background threads tokenize and collate the batches of
// an epoch plan ahead of the trainer, into (optionally pinned) host tensors, and the
// trainer takes them in plan order. See data/prefetch_queue.h for the ordering and
// memory bound.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "data/length_bucket_sampler.h"
#include "data/prefetch_queue.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"

namespace trainyard {

struct Batch {
  torch::Tensor input_ids;       // [B, L] int64, padded to the batch's longest text
  torch::Tensor attention_mask;  // [B, L] int64, 1 = real token
  torch::Tensor labels;          // [B] int64
  int64_t real_tokens = 0;
  int64_t size() const { return labels.size(0); }
};

// Tokenizes and pads the examples of one batch. Thread-safe.
Batch CollateBatch(const TextDataset& data, const Tokenizer& tokenizer, const BatchIndices& indices, int max_len,
                   bool pin_memory);

struct PipelineOptions {
  size_t prefetch_batches = 8;  // 0: collate on the trainer's thread when asked
  size_t threads = 2;
  bool pin_memory = false;  // page-locked host tensors for async H2D copies
  int max_len = 128;
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
