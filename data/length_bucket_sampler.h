// Decides which examples form each batch of an epoch, and in what order.
//
// The plan for epoch e is a pure function of (seed, e): the example indices are
// shuffled, cut into windows of `bucket_batches` batches, each window is sorted by
// length and cut into batches (so a batch holds texts of similar length and pads
// little), and the batches are shuffled again so long and short ones interleave.
// A sampler position is just (epoch, next batch index): saving those two numbers in
// a checkpoint resumes the exact stream of batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trainyard {

using BatchIndices = std::vector<int32_t>;

class LengthBucketSampler {
 public:
  // `lengths[i]` is any monotone proxy of example i's token count.
  LengthBucketSampler(std::vector<int32_t> lengths, int batch_size, int bucket_batches, uint64_t seed);

  // All batches of `epoch`, in the order they are trained. The last batch of a
  // window may be smaller than batch_size; no example is dropped.
  std::vector<BatchIndices> EpochPlan(int64_t epoch) const;

  size_t num_examples() const { return lengths_.size(); }

 private:
  std::vector<int32_t> lengths_;
  int batch_size_;
  int bucket_batches_;
  uint64_t seed_;
};

// Fisher-Yates with a splitmix64 stream: the same permutation on every platform and
// standard library, which std::shuffle does not promise.
void DeterministicShuffle(std::vector<int32_t>* items, uint64_t seed);
template <typename T>
void DeterministicShuffleOf(std::vector<T>* items, uint64_t seed);

// Batches of `count` consecutive indices in file order (evaluation, inference).
std::vector<BatchIndices> SequentialBatches(std::size_t count, int batch_size);

}  // namespace trainyard
