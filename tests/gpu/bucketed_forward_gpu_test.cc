// BucketedForward on a GPU (labelled gpu; skipped without one): every bucket replays a
// CUDA graph, the graphs sharing one memory pool. The batches alternate buckets, so a
// replay that overwrote another bucket's output before it was read would show.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/worker/jobs/bucketed_forward_check.h"
#include "tests/worker/models/cast_copies.h"
#include "worker/train/amp.h"

namespace trainyard::testing {
namespace {

TEST(BucketedForwardGpu, ReplayedBucketsGiveEachBatchItsOwnShapesLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible";
  at::globalContext().setAllowTF32CuBLAS(false);
  for (ModelFamily family : {ModelFamily::kBert, ModelFamily::kRoberta, ModelFamily::kGpt2})
    ExpectBucketsMatchOwnShape(family, torch::Device(torch::kCUDA, 0), true);
}

// Serving in bf16: the frozen model's weights are cast once, in the warm-up before each
// capture, and the replays read those copies. The reference is the same weights left
// trainable, run eagerly at each batch's own shape, autocast casting them on every
// pass; bf16's rounding and the bucket's padding (other product shapes) bound the
// difference.
TEST(BucketedForwardGpu, Bf16ReplaysReadWeightsCastOnceAndGiveAutocastsLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible";
  const torch::Device cuda(torch::kCUDA, 0);
  for (ModelFamily family : {ModelFamily::kBert, ModelFamily::kGpt2}) {
    SCOPED_TRACE(FamilyName(family));
    Model served = TinyClassifier(family, cuda), reference = TinyClassifier(family, cuda);  // the same seed
    Freeze(*served);
    BucketedForward bucketed(served, kBuckets, Precision::kBf16, true);
    ASSERT_EQ(bucketed.Warm().size(), kBuckets.size());
    const int64_t made = CastCopiesMade(served);
    EXPECT_GT(made, 0);
    for (const auto& [rows, seq] : kBatches) {
      auto [ids, mask] = RandomBatch(rows, seq, served->info().pad_id);
      torch::Tensor expected;
      {
        torch::NoGradGuard no_grad;
        AutocastScope autocast(torch::kCUDA, Precision::kBf16);
        expected = reference->forward(ids.to(cuda), mask.to(cuda)).to(torch::kFloat).to(torch::kCPU);
      }
      const torch::Tensor got = bucketed.Forward(ids, mask);
      ASSERT_EQ(got.sizes(), expected.sizes());
      EXPECT_LT((got - expected).abs().max().item<double>(), 2e-2 * (1 + expected.abs().max().item<double>()))
          << rows << " x " << seq << " in bucket " << bucketed.BucketFor(rows, seq);
    }
    EXPECT_EQ(CastCopiesMade(served), made) << "replays, and the eager batch no bucket holds, cast nothing again";
  }
}

}  // namespace
}  // namespace trainyard::testing
