// BucketedForward on a GPU (labelled gpu; skipped without one): every bucket replays a
// CUDA graph, the graphs sharing one memory pool. The batches alternate buckets, so a
// replay that overwrote another bucket's output before it was read would show.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/worker/jobs/bucketed_forward_check.h"

namespace trainyard::testing {
namespace {

TEST(BucketedForwardGpu, ReplayedBucketsGiveEachBatchItsOwnShapesLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible";
  at::globalContext().setAllowTF32CuBLAS(false);
  for (ModelFamily family : {ModelFamily::kBert, ModelFamily::kRoberta, ModelFamily::kGpt2})
    ExpectBucketsMatchOwnShape(family, torch::Device(torch::kCUDA, 0), true);
}

}  // namespace
}  // namespace trainyard::testing
