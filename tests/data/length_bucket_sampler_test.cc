#include "data/length_bucket_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace trainyard {
namespace {

std::vector<int32_t> Lengths(int n) {
  std::vector<int32_t> lengths;
  for (int i = 0; i < n; ++i) lengths.push_back((i * 7919) % 500);
  return lengths;
}

TEST(LengthBucketSampler, EveryExampleExactlyOncePerEpoch) {
  LengthBucketSampler sampler(Lengths(1003), 16, 10, 42);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int32_t> seen;
    for (const auto& batch : sampler.EpochPlan(epoch)) {
      EXPECT_LE(batch.size(), 16u);
      seen.insert(batch.begin(), batch.end());
    }
    ASSERT_EQ(seen.size(), 1003u);
    EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), 1003u);
  }
}

TEST(LengthBucketSampler, SameSeedSamePlanOtherEpochOtherPlan) {
  LengthBucketSampler a(Lengths(500), 8, 5, 7), b(Lengths(500), 8, 5, 7);
  EXPECT_EQ(a.EpochPlan(3), b.EpochPlan(3));
  EXPECT_NE(a.EpochPlan(3), a.EpochPlan(4));
}

TEST(LengthBucketSampler, BatchesHoldSimilarLengths) {
  auto lengths = Lengths(4000);
  LengthBucketSampler bucketed(lengths, 32, 50, 1), unbucketed(lengths, 32, 1, 1);
  auto mean_spread = [&](const std::vector<BatchIndices>& plan) {
    double total = 0;
    for (const auto& batch : plan) {
      auto [lo, hi] = std::minmax_element(batch.begin(), batch.end(),
                                          [&](int32_t x, int32_t y) { return lengths[x] < lengths[y]; });
      total += lengths[*hi] - lengths[*lo];
    }
    return total / plan.size();
  };
  // A window of one batch is no bucketing at all; 50 batches sort 1600 texts together.
  EXPECT_LT(mean_spread(bucketed.EpochPlan(0)) * 10, mean_spread(unbucketed.EpochPlan(0)));
}

}  // namespace
}  // namespace trainyard
