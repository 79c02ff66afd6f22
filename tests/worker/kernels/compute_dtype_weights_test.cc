#include "worker/kernels/compute_dtype_weights.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace trainyard {
namespace {

// CPU autocast to `dtype` for the scope (the worker's AutocastScope lives in ty_train).
class CpuAutocast {
 public:
  explicit CpuAutocast(at::ScalarType dtype) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, dtype);
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;
};

// Odd sizes, as packed_linear_test's.
constexpr int64_t kK = 131, kN = 77;

void ExpectSameBits(const torch::Tensor& ours, const torch::Tensor& autocasts) {
  ASSERT_EQ(ours.scalar_type(), autocasts.scalar_type());
  EXPECT_TRUE(torch::equal(ours, autocasts)) << "max diff " << (ours - autocasts).abs().max().item<float>();
}

TEST(ComputeDtypeWeights, GivesAutocastsBitsCastingOnceUntilTheWeightChanges) {
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  CpuAutocast autocast(at::kBFloat16);
  torch::Tensor x = torch::randn({3, 19, kK}), w = torch::randn({kN, kK}), b = torch::randn({kN});
  ComputeDtypeWeights cast;
  ASSERT_TRUE(ComputeDtypeWeights::Applies(x, {w}, {b}));
  ExpectSameBits(cast.Forward(x, {w}, {b}), torch::linear(x, w, b));
  ExpectSameBits(cast.Forward(x, {w}, {b}), torch::linear(x, w, b));
  EXPECT_EQ(cast.copies_made(), 1) << "the second pass reuses the copy";

  w.mul_(-2);  // in place, as a load or a merge writes: the version counter moves
  ExpectSameBits(cast.Forward(x, {w}, {b}), torch::linear(x, w, b));
  EXPECT_EQ(cast.copies_made(), 2);
  b.add_(1);
  ExpectSameBits(cast.Forward(x, {w}, {b}), torch::linear(x, w, b));
  EXPECT_EQ(cast.copies_made(), 3);
  w = torch::randn({kN, kK});  // another tensor altogether
  ExpectSameBits(cast.Forward(x, {w}, {b}), torch::linear(x, w, b));
  EXPECT_EQ(cast.copies_made(), 4);
}

TEST(ComputeDtypeWeights, ConcatenatesAndKeepsATransposedWeightsLayout) {
  torch::manual_seed(2);
  torch::NoGradGuard no_grad;
  CpuAutocast autocast(at::kBFloat16);
  std::vector<torch::Tensor> w = {torch::randn({kN, kK}), torch::randn({kN, kK}), torch::randn({5, kK})};
  std::vector<torch::Tensor> b = {torch::randn({kN}), torch::randn({kN}), torch::randn({5})};
  torch::Tensor x = torch::randn({40, kK});
  ComputeDtypeWeights fused, unbiased, transposed;
  ExpectSameBits(fused.Forward(x, w, b), torch::linear(x, torch::cat(w), torch::cat(b)));
  const std::vector<torch::Tensor> none(3);
  ExpectSameBits(unbiased.Forward(x, w, none), torch::linear(x, torch::cat(w)));

  const torch::Tensor stored_in_out = torch::randn({kK, kN});  // Conv1D's [K, N]
  const ComputeDtypeWeights::Copies copies = transposed.Current({stored_in_out}, {b[0]});
  EXPECT_EQ(copies.weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(copies.weight.sizes(), stored_in_out.sizes());
  ExpectSameBits(torch::addmm(copies.bias, x, copies.weight), torch::addmm(b[0], x, stored_in_out));
}

TEST(ComputeDtypeWeights, GradientToTheInputIsAutocasts) {
  torch::manual_seed(3);
  CpuAutocast autocast(at::kBFloat16);
  torch::Tensor w = torch::randn({kN, kK}), b = torch::randn({kN}), upstream = torch::randn({2, 33, kN});
  torch::Tensor x = torch::randn({2, 33, kK}, torch::requires_grad()), x_ref = x.detach().clone().requires_grad_();
  ComputeDtypeWeights cast;
  ASSERT_TRUE(ComputeDtypeWeights::Applies(x, {w}, {b}));
  cast.Forward(x, {w}, {b}).backward(upstream.to(torch::kBFloat16));
  torch::linear(x_ref, w, b).backward(upstream.to(torch::kBFloat16));
  ExpectSameBits(x.grad(), x_ref.grad());
}

TEST(ComputeDtypeWeights, OneCopyPerDtypeSoBf16AndFp16PassesDoNotRemakeEachOthers) {
  torch::manual_seed(4);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({4, kK}), w = torch::randn({kN, kK}), b = torch::randn({kN});
  ComputeDtypeWeights cast;
  for (int round = 0; round < 2; ++round) {
    {
      CpuAutocast autocast(at::kBFloat16);
      ExpectSameBits(cast.Forward(x, {w}, {b}), torch::linear(x, w, b));
    }
    {
      CpuAutocast autocast(at::kHalf);
      ExpectSameBits(cast.Forward(x, {w}, {b}), torch::linear(x, w, b));
    }
  }
  EXPECT_EQ(cast.copies_made(), 2);
}

TEST(ComputeDtypeWeights, AppliesOnlyToFrozenFp32WeightsUnderLowPrecisionAutocast) {
  torch::Tensor x = torch::randn({4, kK}), w = torch::randn({kN, kK}), b = torch::randn({kN});
  EXPECT_FALSE(ComputeDtypeWeights::Applies(x, {w}, {b})) << "autocast off";
  CpuAutocast autocast(at::kBFloat16);
  EXPECT_TRUE(ComputeDtypeWeights::Applies(x, {w}, {b}));
  EXPECT_FALSE(ComputeDtypeWeights::Applies(x, {w.clone().requires_grad_()}, {b})) << "a weight that trains";
  EXPECT_FALSE(ComputeDtypeWeights::Applies(x, {w}, {b.clone().requires_grad_()})) << "a bias that trains";
  EXPECT_FALSE(ComputeDtypeWeights::Applies(x, {w.to(torch::kBFloat16)}, {b})) << "already 16-bit";
  EXPECT_FALSE(ComputeDtypeWeights::Applies(x, {w, w}, {b, torch::Tensor()})) << "a bias for some weights only";
  EXPECT_FALSE(ComputeDtypeWeights::Applies(x, {w.view(-1)}, {b})) << "not a matrix";
  EXPECT_FALSE(ComputeDtypeWeights::Applies(torch::randn({0, kK}), {w}, {b})) << "no rows";
  SetWeightCastsOnce(false);  // runtime.weight_casts: each_pass
  EXPECT_FALSE(ComputeDtypeWeights::Applies(x, {w}, {b}));
  SetWeightCastsOnce(true);
  EXPECT_TRUE(ComputeDtypeWeights::Applies(x, {w}, {b}));
}

}  // namespace
}  // namespace trainyard
