#include "data/length_bucket_sampler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace trainyard {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

template <typename T>
void Shuffle(std::vector<T>* items, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = items->size(); i > 1; --i) {
    size_t j = SplitMix64(&state) % i;
    std::swap((*items)[i - 1], (*items)[j]);
  }
}

}  // namespace

void DeterministicShuffle(std::vector<int32_t>* items, uint64_t seed) { Shuffle(items, seed); }

template <typename T>
void DeterministicShuffleOf(std::vector<T>* items, uint64_t seed) {
  Shuffle(items, seed);
}
template void DeterministicShuffleOf(std::vector<BatchIndices>* items, uint64_t seed);

LengthBucketSampler::LengthBucketSampler(std::vector<int32_t> lengths, int batch_size, int bucket_batches,
                                         uint64_t seed)
    : lengths_(std::move(lengths)), batch_size_(batch_size), bucket_batches_(bucket_batches), seed_(seed) {
  if (batch_size_ < 1 || bucket_batches_ < 1)
    throw std::invalid_argument("LengthBucketSampler: batch_size and bucket_batches must be >= 1");
}

std::vector<BatchIndices> LengthBucketSampler::EpochPlan(int64_t epoch) const {
  std::vector<int32_t> order(lengths_.size());
  std::iota(order.begin(), order.end(), 0);
  const uint64_t epoch_seed = seed_ * 1000003ULL + static_cast<uint64_t>(epoch);
  DeterministicShuffle(&order, epoch_seed);
  const size_t window = static_cast<size_t>(batch_size_) * bucket_batches_;
  std::vector<BatchIndices> batches;
  for (size_t begin = 0; begin < order.size(); begin += window) {
    auto first = order.begin() + begin;
    auto last = order.begin() + std::min(order.size(), begin + window);
    std::stable_sort(first, last, [&](int32_t a, int32_t b) { return lengths_[a] < lengths_[b]; });
    for (auto it = first; it < last; it += std::min<ptrdiff_t>(batch_size_, last - it))
      batches.emplace_back(it, it + std::min<ptrdiff_t>(batch_size_, last - it));
  }
  DeterministicShuffleOf(&batches, epoch_seed ^ 0xA5A5A5A5ULL);
  return batches;
}

std::vector<BatchIndices> SequentialBatches(size_t count, int batch_size) {
  std::vector<BatchIndices> batches;
  for (size_t begin = 0; begin < count; begin += batch_size) {
    BatchIndices batch;
    for (size_t i = begin; i < std::min(count, begin + batch_size); ++i) batch.push_back(static_cast<int32_t>(i));
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace trainyard
