// BucketedForward, the GPU serving path, on the CPU: the buckets run eagerly, which
// tests the padding rule (a batch padded up to its bucket gives the logits of its own
// shape) and the choice of bucket. tests/gpu/bucketed_forward_gpu_test.cc replays them
// as CUDA graphs.
#include "worker/jobs/bucketed_forward.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/worker/jobs/bucketed_forward_check.h"

namespace trainyard::testing {
namespace {

TEST(BucketedForward, PicksTheSmallestBucketHoldingTheBatch) {
  BucketedForward bucketed(TinyClassifier(ModelFamily::kBert, torch::kCPU), kBuckets, Precision::kFp32, false);
  EXPECT_EQ(bucketed.BucketFor(1, 5), 0);
  EXPECT_EQ(bucketed.BucketFor(2, 16), 1);
  EXPECT_EQ(bucketed.BucketFor(2, 17), 2);  // 4 x 64 and 8 x 32 hold 256 tokens each: the first wins
  EXPECT_EQ(bucketed.BucketFor(5, 20), 3);
  EXPECT_EQ(bucketed.BucketFor(3, 64), 2);
  EXPECT_EQ(bucketed.BucketFor(9, 8), -1);
  EXPECT_EQ(bucketed.BucketFor(1, 65), -1);
}

TEST(BucketedForward, PaddedUpToItsBucketABatchGetsItsOwnShapesLogits) {
  for (ModelFamily family : {ModelFamily::kBert, ModelFamily::kRoberta, ModelFamily::kGpt2})
    ExpectBucketsMatchOwnShape(family, torch::kCPU, false);
}

TEST(BucketedForward, CudaGraphsNeedACudaModel) {
  EXPECT_THROW(BucketedForward(TinyClassifier(ModelFamily::kBert, torch::kCPU), kBuckets, Precision::kFp32, true),
               std::invalid_argument);
}

}  // namespace
}  // namespace trainyard::testing
