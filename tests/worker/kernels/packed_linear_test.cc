#include "worker/kernels/packed_linear.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>
#include <vector>

#include "tests/worker/numeric_bounds.h"
#include "worker/models/layers.h"

namespace trainyard {
namespace {

// Every test runs the oneDNN path whatever CPU this is (auto would pick MKL on Intel's).
class PackedLinearTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasMKLDNN()) GTEST_SKIP() << "this libtorch was built without oneDNN";
    SetCpuGemm(CpuGemm::kOneDnn);
  }
  void TearDown() override { SetCpuGemm(CpuGemm::kAuto); }
};

// Odd sizes, so no product fits oneDNN's blocks exactly.
constexpr int64_t kK = 131, kN = 77;

// ours and reference: two float32 results of the product a x b (+ bias); they may differ
// by twice the product's forward error bound (tests/worker/numeric_bounds.h), whatever
// kernel each ran.
void ExpectClose(const torch::Tensor& ours, const torch::Tensor& reference, const torch::Tensor& a,
                 const torch::Tensor& b, const torch::Tensor& bias = {}) {
  EXPECT_TRUE(numeric::SameProduct(ours, reference, a, b, bias));
}

TEST_F(PackedLinearTest, EqualsLinearInEveryLayout) {
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({3, 19, kK}), w = torch::randn({kN, kK}), bias = torch::randn({kN});
  PackedLinear plain, transposed, unbiased;
  ASSERT_TRUE(PackedLinear::Applies(x, {w}, {bias}));
  ExpectClose(plain.Forward(x, {w}, {bias}), torch::linear(x, w, bias), x, w.t(), bias);
  const torch::Tensor stored_in_out = w.t().contiguous();  // Conv1D's [K, N]
  ExpectClose(transposed.Forward(x, {stored_in_out.t()}, {bias}), torch::linear(x, w, bias), x, w.t(), bias);
  ExpectClose(unbiased.Forward(x.view({-1, kK}), {w}, {torch::Tensor()}), torch::linear(x.view({-1, kK}), w),
              x.view({-1, kK}), w.t());
}

TEST_F(PackedLinearTest, ConcatenatedWeightsEqualOneLinear) {
  torch::manual_seed(2);
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> w = {torch::randn({kN, kK}), torch::randn({kN, kK}), torch::randn({5, kK})};
  std::vector<torch::Tensor> b = {torch::randn({kN}), torch::randn({kN}), torch::randn({5})};
  torch::Tensor x = torch::randn({40, kK});
  PackedLinear fused;
  ExpectClose(fused.Forward(x, w, b), torch::linear(x, torch::cat(w), torch::cat(b)), x, torch::cat(w).t(),
              torch::cat(b));
}

TEST_F(PackedLinearTest, GradientToInputEqualsAutograds) {
  torch::manual_seed(3);
  torch::Tensor w = torch::randn({kN, kK}), bias = torch::randn({kN});
  torch::Tensor x = torch::randn({2, 33, kK}, torch::requires_grad()), upstream = torch::randn({2, 33, kN});
  PackedLinear packed;
  ASSERT_TRUE(PackedLinear::Applies(x, {w}, {bias}));
  torch::Tensor ours = packed.Forward(x, {w}, {bias});
  ASSERT_TRUE(ours.requires_grad());
  torch::Tensor our_grad = torch::autograd::grad({ours}, {x}, {upstream})[0];
  torch::Tensor reference = torch::linear(x, w, bias);
  torch::Tensor reference_grad = torch::autograd::grad({reference}, {x}, {upstream})[0];
  ExpectClose(ours, reference, x.detach(), w.t(), bias);
  ExpectClose(our_grad, reference_grad, upstream, w);
}

TEST_F(PackedLinearTest, ReordersFollowAWeightThatChanges) {
  torch::manual_seed(4);
  torch::NoGradGuard no_grad;
  torch::Tensor w = torch::randn({kN, kK}), x = torch::randn({24, kK});
  PackedLinear packed;
  ExpectClose(packed.Forward(x, {w}, {torch::Tensor()}), torch::linear(x, w), x, w.t());
  w.mul_(-2.0);  // in place: the version counter moves
  ExpectClose(packed.Forward(x, {w}, {torch::Tensor()}), torch::linear(x, w), x, w.t());
  w.set_data(torch::randn({kN, kK}));  // new storage under the same handle
  ExpectClose(packed.Forward(x, {w}, {torch::Tensor()}), torch::linear(x, w), x, w.t());
}

TEST_F(PackedLinearTest, ReordersMadeInInferenceModeServeTraining) {
  torch::manual_seed(5);
  torch::Tensor w = torch::randn({kN, kK});
  PackedLinear packed;
  {
    torch::InferenceMode inference;
    packed.Forward(torch::randn({20, kK}), {w}, {torch::Tensor()});
  }
  torch::Tensor x = torch::randn({20, kK}, torch::requires_grad());
  torch::Tensor grad = torch::autograd::grad({packed.Forward(x, {w}, {torch::Tensor()}).sum()}, {x})[0];
  ExpectClose(grad, w.sum(0).expand({20, kK}), torch::ones({20, kN}), w);
}

TEST_F(PackedLinearTest, TrainableWeightsAutocastAndTheMklSettingStayOnAten) {
  torch::Tensor x = torch::randn({20, kK}), w = torch::randn({kN, kK}, torch::requires_grad());
  torch::Tensor frozen = w.detach(), bias = torch::zeros({kN}, torch::requires_grad());
  EXPECT_FALSE(PackedLinear::Applies(x, {w}, {torch::Tensor()}));
  EXPECT_FALSE(PackedLinear::Applies(x, {frozen}, {bias}));
  EXPECT_TRUE(PackedLinear::Applies(x, {frozen}, {bias.detach()}));
  {
    // Evaluation during training: still ATen's path, since an optimizer may write the
    // weight without moving its version counter.
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(PackedLinear::Applies(x, {w}, {torch::Tensor()}));
  }
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    EXPECT_FALSE(PackedLinear::Applies(x, {frozen}, {torch::Tensor()}));
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
  EXPECT_FALSE(PackedLinear::Applies(x.to(torch::kBFloat16), {frozen}, {torch::Tensor()}));
  SetCpuGemm(CpuGemm::kMkl);
  EXPECT_FALSE(PackedLinear::Applies(x, {frozen}, {torch::Tensor()}));
  EXPECT_EQ(CpuGemmInUseName(), "mkl");
  EXPECT_THROW(CpuGemmNamed("openblas"), std::invalid_argument);
  EXPECT_EQ(CpuGemmNamed("onednn"), CpuGemm::kOneDnn);
}

TEST_F(PackedLinearTest, ConcurrentForwardsShareOneReorder) {
  torch::manual_seed(6);
  torch::Tensor w = torch::randn({kN, kK}), x = torch::randn({30, kK});
  torch::Tensor reference = torch::linear(x, w);
  PackedLinear packed;
  std::vector<torch::Tensor> results(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      torch::InferenceMode inference;
      for (int repeat = 0; repeat < 5; ++repeat) results[i] = packed.Forward(x, {w}, {torch::Tensor()});
    });
  for (auto& t : threads) t.join();
  for (const auto& r : results) ExpectClose(r, reference, x, w.t());
}

// The layers use the path when it applies, and give what ATen gives.
TEST_F(PackedLinearTest, LayersAgreeWithAtenEitherWay) {
  torch::manual_seed(7);
  AdaptableLinear linear(kK, kN);
  Conv1D conv(kK, kN);
  for (auto& p : linear->parameters()) p.set_requires_grad(false);
  for (auto& p : conv->parameters()) p.set_requires_grad(false);
  torch::Tensor x = torch::randn({2, 25, kK}, torch::requires_grad());
  torch::Tensor ours_linear = linear(x), ours_conv = conv(x);
  SetCpuGemm(CpuGemm::kMkl);
  const torch::Tensor input = x.detach();
  ExpectClose(ours_linear, linear(x), input, linear->weight.t(), linear->bias);
  ExpectClose(ours_conv, conv(x), input, conv->weight, conv->bias);  // Conv1D stores [in, out]
  ExpectClose(torch::autograd::grad({ours_conv.sum()}, {x})[0], torch::autograd::grad({conv(x).sum()}, {x})[0],
              torch::ones({2, 25, kN}), conv->weight.t());
}

}  // namespace
}  // namespace trainyard
