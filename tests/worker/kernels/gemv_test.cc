#include "worker/kernels/gemv.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <set>
#include <thread>

#include "tests/worker/numeric_bounds.h"
#include "worker/kernels/parallel_slices.h"

namespace trainyard {
namespace {

// Shapes that leave remainders everywhere: K not a multiple of the 4-row step or of the
// 16 dot-product lanes, N not a multiple of the column tile.
constexpr int64_t kK = 771, kN = 1283;

TEST(RowProduct, ConvLayoutEqualsAddmmForEveryRowCount) {
  torch::manual_seed(3);
  torch::Tensor w = torch::randn({kK, kN}), bias = torch::randn({kN});
  torch::InferenceMode inference;
  for (int64_t rows = 1; rows <= kMaxRowProductRows; ++rows) {
    torch::Tensor x = torch::randn({rows, 1, kK});
    ASSERT_TRUE(RowProductApplies(x, w));
    torch::Tensor ours = RowsTimesWeight(x, w, bias);
    torch::Tensor reference = torch::addmm(bias, x.reshape({rows, kK}), w).view({rows, 1, kN});
    EXPECT_TRUE(numeric::SameProduct(ours, reference, x, w, bias)) << rows << " rows";
    EXPECT_TRUE(numeric::SameProduct(RowsTimesWeight(x, w, {}), torch::matmul(x, w), x, w)) << rows << " rows";
  }
}

TEST(RowProduct, LinearLayoutEqualsLinearForEveryRowCount) {
  torch::manual_seed(4);
  torch::Tensor w = torch::randn({kN, kK}), bias = torch::randn({kN});
  torch::InferenceMode inference;
  for (int64_t rows = 1; rows <= kMaxRowProductRows; ++rows) {
    torch::Tensor x = torch::randn({1, rows, kK});
    torch::Tensor ours = RowsTimesWeightT(x, w, bias);
    EXPECT_TRUE(numeric::SameProduct(ours, torch::linear(x, w, bias), x, w.t(), bias)) << rows << " rows";
    EXPECT_TRUE(numeric::SameProduct(RowsTimesWeightT(x, w, {}), torch::linear(x, w), x, w.t())) << rows << " rows";
  }
}

TEST(RowProduct, SameAnswerOnOneThreadAsOnSeveral) {
  torch::manual_seed(5);
  torch::Tensor w = torch::randn({kK, kN}), x = torch::randn({2, kK});
  torch::InferenceMode inference;
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  torch::Tensor two = RowsTimesWeight(x, w, {}), two_t = RowsTimesWeightT(x, w.t().contiguous(), {});
  at::set_num_threads(1);
  torch::Tensor one = RowsTimesWeight(x, w, {}), one_t = RowsTimesWeightT(x, w.t().contiguous(), {});
  at::set_num_threads(threads);
  EXPECT_TRUE(numeric::SameProduct(one, two, x, w));
  EXPECT_TRUE(one_t.equal(two_t));  // each output is one thread's dot product either way
}

TEST(RowProduct, AppliesOnlyWhereTheKernelsAreRight) {
  torch::Tensor w = torch::randn({64, 32}), x = torch::randn({3, 64});
  {
    torch::InferenceMode inference;
    EXPECT_TRUE(RowProductApplies(x, w));
    EXPECT_FALSE(RowProductApplies(torch::randn({kMaxRowProductRows + 1, 64}), w));  // addmm is faster there
    EXPECT_FALSE(RowProductApplies(x.to(torch::kDouble), w.to(torch::kDouble)));
    EXPECT_FALSE(RowProductApplies(x, w.t()));  // not contiguous
    EXPECT_FALSE(RowProductApplies(x.to(torch::kBFloat16), w.to(torch::kBFloat16)));
    at::autocast::set_autocast_enabled(at::kCPU, true);
    EXPECT_FALSE(RowProductApplies(x, w));
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
  torch::Tensor trained = w.clone().requires_grad_(true);
  EXPECT_FALSE(RowProductApplies(x, trained));  // autograd must see the product
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(RowProductApplies(x, trained));
}

// The bug this guards: at::parallel_for compiled into a TU without -fopenmp runs on one
// thread, silently.
TEST(ParallelSlices, RunsOnSeveralThreadsAndCoversEverySlice) {
  ASSERT_TRUE(ParallelSlicesAreParallel()) << "built without libtorch's OpenMP runtime";
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::vector<int> seen(64, 0);
  ParallelSlices(64, 2, [&](int64_t s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
    ++seen[size_t(s)];
  });
  EXPECT_EQ(threads.size(), 2u);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 64);
}

}  // namespace
}  // namespace trainyard
