// Work under an address-space cap (worker/jobs/memory_cap.h): a oneDNN kernel that could
// not be built under the cap leaves the work after it alone.
#include "worker/jobs/memory_cap.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <stdexcept>
#include <thread>

#include "tests/worker/numeric_bounds.h"
#include "worker/kernels/packed_linear.h"

namespace trainyard {
namespace {

constexpr int64_t kK = 96, kN = 80;

class MemoryCapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasMKLDNN()) GTEST_SKIP() << "this libtorch was built without oneDNN";
    SetCpuGemm(CpuGemm::kOneDnn);
    torch::manual_seed(3);
    w_ = torch::randn({kN, kK});
    b_ = torch::randn({kN});
    torch::NoGradGuard no_grad;
    packed_.Forward(torch::randn({2, kK}), {w_}, {b_});  // the weight's reorder, made uncapped
  }
  void TearDown() override { SetCpuGemm(CpuGemm::kAuto); }

  // A product whose row count no earlier call had: oneDNN builds kernels for it.
  void NewShapeProduct(int64_t rows) {
    torch::NoGradGuard no_grad;
    const torch::Tensor x = torch::randn({rows, kK});
    const torch::Tensor y = packed_.Forward(x, {w_}, {b_});
    // The same product as torch::linear's, within its forward error bound (numeric_bounds.h).
    if (!numeric::SameProduct(y, torch::linear(x, w_, b_), x, w_.t(), b_)) throw std::runtime_error("wrong product");
  }

  torch::Tensor w_, b_;
  PackedLinear packed_;
};

// Why RunCapped uses a thread of its own: on a thread where a kernel build ran out of
// memory, later builds fail too, cap or no cap. (Should a later oneDNN stop doing this,
// this test says so, and the thread may go.)
TEST_F(MemoryCapTest, AFailedKernelBuildPoisonsItsThread) {
  bool first_failed = false, later_failed = false;
  std::thread([&] {
    rlimit previous{};
    getrlimit(RLIMIT_AS, &previous);
    rlimit cap = previous;
    cap.rlim_cur = static_cast<rlim_t>((ProcStatusMb("VmSize:") + 0.05) * 1048576.0);
    setrlimit(RLIMIT_AS, &cap);
    try {
      NewShapeProduct(7);
    } catch (const std::exception&) {
      first_failed = true;
    }
    setrlimit(RLIMIT_AS, &previous);
    try {
      NewShapeProduct(11);
    } catch (const std::exception&) {
      later_failed = true;
    }
  }).join();
  EXPECT_TRUE(first_failed) << "a kernel was built within 50 KB of headroom";
  EXPECT_TRUE(later_failed);
}

TEST_F(MemoryCapTest, WorkAfterAnOutOfMemoryFailureRunsAsItWouldAlone) {
  bool capped = false;
  try {
    RunCapped(
        0.05, [&] { NewShapeProduct(13); }, &capped);
    ADD_FAILURE() << "a kernel was built within 50 KB of headroom";
  } catch (const std::exception& e) {
    EXPECT_TRUE(capped);
    EXPECT_TRUE(IsOutOfMemory(e, capped)) << e.what();
  }
  EXPECT_NO_THROW(RunCapped(
      0, [&] { NewShapeProduct(17); }, &capped));
  EXPECT_FALSE(capped);
  EXPECT_NO_THROW(RunCapped(
      200, [&] { NewShapeProduct(19); }, &capped));
  EXPECT_TRUE(capped);
}

}  // namespace
}  // namespace trainyard
