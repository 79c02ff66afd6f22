#include "worker/train/batch_pipeline.h"

#include <algorithm>

namespace trainyard {

TokenCache::TokenCache(const TextDataset& data, const Tokenizer& tokenizer, int max_len, size_t budget_bytes)
    : data_(data),
      tokenizer_(tokenizer),
      max_len_(max_len),
      budget_bytes_(budget_bytes),
      once_(new std::once_flag[data.examples.size()]),
      ids_(data.examples.size()),
      kept_(data.examples.size(), 0) {}

std::vector<int32_t> TokenCache::Ids(int32_t example) {
  const size_t i = static_cast<size_t>(example);
  std::vector<int32_t> fresh;
  bool encoded = false;
  std::call_once(once_[i], [&] {
    fresh = tokenizer_.Encode(data_.examples.at(i).text, max_len_);
    encoded = true;
    const size_t bytes = fresh.size() * sizeof(int32_t) + sizeof(std::vector<int32_t>);
    if (bytes_.fetch_add(bytes) + bytes <= budget_bytes_) {
      ids_[i] = fresh;
      kept_[i] = 1;
    } else {
      bytes_.fetch_sub(bytes);
    }
  });
  if (kept_[i]) return ids_[i];
  return encoded ? fresh : tokenizer_.Encode(data_.examples.at(i).text, max_len_);
}

std::vector<int> PadBucketLengths(int count, int max_len) {
  std::vector<int> lengths;
  for (int i = 1; i <= count; ++i) {
    const int64_t even = (int64_t(i) * max_len + count - 1) / count;
    const int length = static_cast<int>(std::min<int64_t>(max_len, (even + 7) / 8 * 8));
    if (lengths.empty() || length > lengths.back()) lengths.push_back(length);
  }
  return lengths;
}

Batch CollateBatch(const TextDataset& data, const Tokenizer& tokenizer, const BatchIndices& indices, int max_len,
                   bool pin_memory, TokenCache* cache, const std::vector<int>& pad_lengths) {
  std::vector<std::vector<int32_t>> encoded;
  encoded.reserve(indices.size());
  size_t longest = 1;
  for (int32_t i : indices) {
    encoded.push_back(cache ? cache->Ids(i) : tokenizer.Encode(data.examples.at(i).text, max_len));
    longest = std::max(longest, encoded.back().size());
  }
  for (int padded : pad_lengths)
    if (static_cast<size_t>(padded) >= longest) {
      longest = static_cast<size_t>(padded);
      break;
    }
  const auto batch = static_cast<int64_t>(indices.size());
  const auto length = static_cast<int64_t>(longest);
  auto options = torch::TensorOptions().dtype(torch::kLong).pinned_memory(pin_memory);
  Batch out;
  out.input_ids = torch::full({batch, length}, int64_t(tokenizer.pad_id()), options);
  out.attention_mask = torch::zeros({batch, length}, options);
  out.labels = torch::empty({batch}, options);
  auto ids = out.input_ids.accessor<int64_t, 2>();
  auto mask = out.attention_mask.accessor<int64_t, 2>();
  auto labels = out.labels.accessor<int64_t, 1>();
  for (int64_t row = 0; row < batch; ++row) {
    const auto& tokens = encoded[row];
    for (size_t col = 0; col < tokens.size(); ++col) {
      ids[row][col] = tokens[col];
      mask[row][col] = 1;
    }
    labels[row] = data.examples[indices[row]].label;
    out.real_tokens += static_cast<int64_t>(tokens.size());
  }
  return out;
}

torch::Tensor ForwardBatch(ModelImpl& model, const Batch& batch) {
  if (batch.packing.defined()) return model.ForwardPacked(batch.input_ids, batch.attention_mask, batch.packing);
  return model.forward(batch.input_ids, batch.attention_mask);
}

void PackOnHost(const HostPacking& how, Batch* batch) {
  const torch::Tensor& mask = batch->attention_mask;
  if (how.policy == Unpadding::kNever || !mask.is_cpu()) return;
  if (how.policy == Unpadding::kAuto && !TokenIndex::Worth(mask)) return;
  const int64_t granule = how.for_graphs ? GraphTokenGranule(mask.size(0), mask.size(1)) : 1;
  batch->packing = PackTokens(mask, granule, mask.is_pinned());
}

BatchPipeline::BatchPipeline(const TextDataset& data, const Tokenizer& tokenizer, std::vector<BatchIndices> batches,
                             const PipelineOptions& options)
    : batches_(std::move(batches)) {
  auto produce = [this, &data, &tokenizer, options](size_t i) {
    if (options.before_collate) options.before_collate(i);
    Batch batch = CollateBatch(data, tokenizer, batches_[i], options.max_len, options.pin_memory, options.cache,
                               options.pad_lengths);
    PackOnHost(options.packing, &batch);
    return batch;
  };
  queue_ = std::make_unique<PrefetchQueue<Batch>>(batches_.size(), produce, options.threads, options.prefetch_batches);
}

}  // namespace trainyard
