// The fused bias + GELU kernels (worker/kernels/fused_bias_gelu.h) on a GPU, against the
// composition gelu(x + bias) in fp32 through autograd (labelled gpu; skipped without
// one). Values and dx are compared relative to their largest magnitude: within 1e-5
// where stored in fp32, within one unit in the last place where stored in bf16 or fp16
// (both sides compute in fp32 from the same inputs, so only the final rounding may
// differ); the bias's gradient, summed over the rows in fp32 on both sides in different
// orders, within 1e-4.
//   - fp32, bf16 and fp16 x, for widths 3072 (bert-base's intermediate size), 768, 132
//     (a second, partly masked column tile) and 4, over [B, S, C] and [N, C] rows, rows
//     both fewer and more than a block's warps;
//   - inputs one element into their buffer (not aligned for 4-wide loads: copied);
//   - a frozen bias: x's gradient alone;
//   - no rows: empty values and a zero bias gradient;
//   - widths that are not a multiple of 4 are not claimed and take the composition.
// A BERT classifier's logits and gradients, fused and not, are compared in
// fused_add_norm_gpu_test.cc (model.fused_kernels turns on both kernels).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/gpu/kernel_tolerance.h"
#include "worker/kernels/fused_bias_gelu.h"

namespace trainyard {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

struct Result {
  torch::Tensor y, dx, dbias;
};

// t's values one element into a larger buffer: contiguous, differentiable, and not
// aligned for 4-wide loads.
torch::Tensor OneElementIn(const torch::Tensor& t) {
  return torch::cat({t.new_zeros({1}), t.flatten()}).narrow(0, 1, t.numel()).view(t.sizes());
}

Result RunBiasGelu(const torch::Tensor& x_values, const torch::Tensor& bias_values, const torch::Tensor& dy, bool fused,
                   bool misaligned = false, bool bias_grad = true) {
  torch::Tensor x = x_values.detach().clone().requires_grad_(true);
  torch::Tensor bias = bias_values.detach().clone().requires_grad_(bias_grad);
  Result r;
  if (fused) {
    r.y = FusedBiasGelu(misaligned ? OneElementIn(x) : x, bias);
  } else {
    r.y = torch::gelu(x.to(torch::kFloat) + bias).to(x.scalar_type());
  }
  r.y.backward(dy);
  r.dx = x.grad();
  r.dbias = bias.grad();
  return r;
}

void ExpectClose(const Result& fused, const Result& unfused, const std::string& what) {
  EXPECT_EQ(fused.y.scalar_type(), unfused.y.scalar_type()) << what;
  EXPECT_EQ(fused.dx.scalar_type(), unfused.dx.scalar_type()) << what;
  EXPECT_LE(RelativeError(fused.y, unfused.y), ToleranceFor(unfused.y)) << what << ": y";
  EXPECT_LE(RelativeError(fused.dx, unfused.dx), ToleranceFor(unfused.dx)) << what << ": dx";
  ASSERT_EQ(fused.dbias.defined(), unfused.dbias.defined()) << what;
  if (unfused.dbias.defined()) {
    EXPECT_EQ(fused.dbias.scalar_type(), torch::kFloat) << what;
    EXPECT_LE(RelativeError(fused.dbias, unfused.dbias), 1e-4) << what << ": dbias";
  }
}

struct Case {
  torch::Tensor x, bias, dy;
};

Case MakeCase(const std::vector<int64_t>& shape, torch::Dtype type, uint64_t seed) {
  torch::manual_seed(seed);
  const auto fp32 = torch::dtype(torch::kFloat).device(kCuda);
  Case c;
  c.x = torch::randn(shape, fp32).mul(2.0).to(type);
  c.bias = torch::randn({shape.back()}, fp32).mul(0.5);
  c.dy = torch::randn(shape, fp32).to(type);
  return c;
}

class FusedBiasGeluGpu : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible";
  }
};

TEST_F(FusedBiasGeluGpu, ValuesAndGradientsMatchTheCompositionInEachDtype) {
  const std::vector<std::vector<int64_t>> shapes = {{8, 128, 3072}, {37, 768}, {3, 132}, {1000, 132}, {5, 4}};
  for (torch::Dtype type : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const std::vector<int64_t>& shape : shapes) {
      const Case c = MakeCase(shape, type, 11);
      const std::string what = std::string(c10::toString(type)) + " " + c10::str(shape);
      ASSERT_TRUE(FusedBiasGeluApplies(c.x, c.bias)) << what;
      ExpectClose(RunBiasGelu(c.x, c.bias, c.dy, true), RunBiasGelu(c.x, c.bias, c.dy, false), what);
    }
  }
}

TEST_F(FusedBiasGeluGpu, InputsNotAlignedForWideLoadsMatchTheComposition) {
  for (torch::Dtype type : {torch::kFloat, torch::kBFloat16}) {
    const Case c = MakeCase({64, 768}, type, 12);
    ExpectClose(RunBiasGelu(c.x, c.bias, c.dy, true, /*misaligned=*/true), RunBiasGelu(c.x, c.bias, c.dy, false),
                std::string("one element in, ") + c10::toString(type));
  }
}

TEST_F(FusedBiasGeluGpu, AFrozenBiasGivesTheInputsGradientAlone) {
  const Case c = MakeCase({4, 16, 768}, torch::kBFloat16, 13);
  const Result fused = RunBiasGelu(c.x, c.bias, c.dy, true, false, /*bias_grad=*/false);
  EXPECT_FALSE(fused.dbias.defined());
  ExpectClose(fused, RunBiasGelu(c.x, c.bias, c.dy, false, false, false), "frozen bias");
}

TEST_F(FusedBiasGeluGpu, WidthsNotAMultipleOfFourTakeTheComposition) {
  const Case c = MakeCase({6, 770}, torch::kFloat, 14);
  EXPECT_FALSE(FusedBiasGeluApplies(c.x, c.bias));
  ExpectClose(RunBiasGelu(c.x, c.bias, c.dy, true), RunBiasGelu(c.x, c.bias, c.dy, false), "width 770");
}

TEST_F(FusedBiasGeluGpu, NoRowsGiveEmptyValuesAndAZeroBiasGradient) {
  const Case c = MakeCase({0, 768}, torch::kBFloat16, 15);
  ASSERT_TRUE(FusedBiasGeluApplies(c.x, c.bias));
  const Result fused = RunBiasGelu(c.x, c.bias, c.dy, true);
  EXPECT_EQ(fused.y.numel(), 0);
  EXPECT_EQ(fused.dx.numel(), 0);
  ASSERT_TRUE(fused.dbias.defined());
  EXPECT_TRUE(torch::equal(fused.dbias.cpu(), torch::zeros({768})));
}

}  // namespace
}  // namespace trainyard
