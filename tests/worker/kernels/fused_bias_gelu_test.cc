// The fused bias + GELU entry point off a GPU: it never claims CPU tensors and runs the
// composition there, with the same values and gradients as autograd's; a dense layer's
// GELU off a GPU is the layer's own forward, then Gelu(). The CUDA kernels themselves:
// tests/gpu/fused_bias_gelu_gpu_test.cc.
#include "worker/kernels/fused_bias_gelu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/models/layers.h"

namespace trainyard {
namespace {

TEST(FusedBiasGelu, CpuTensorsTakeTheCompositionWithItsGradients) {
  torch::manual_seed(3);
  const torch::Tensor x_values = torch::randn({4, 6, 32}), bias_values = torch::randn({32});
  const torch::Tensor dy = torch::randn({4, 6, 32});
  EXPECT_FALSE(FusedBiasGeluApplies(x_values, bias_values));
  torch::Tensor x = x_values.clone().requires_grad_(true), bias = bias_values.clone().requires_grad_(true);
  FusedBiasGelu(x, bias).backward(dy);
  torch::Tensor x_ref = x_values.clone().requires_grad_(true), bias_ref = bias_values.clone().requires_grad_(true);
  const torch::Tensor expected = torch::gelu(x_ref + bias_ref);
  expected.backward(dy);
  torch::Tensor again = x_values.clone().requires_grad_(true), bias_again = bias_values.clone().requires_grad_(true);
  EXPECT_TRUE(torch::equal(FusedBiasGelu(again, bias_again), expected));
  EXPECT_TRUE(torch::equal(x.grad(), x_ref.grad()));
  EXPECT_TRUE(torch::equal(bias.grad(), bias_ref.grad()));
}

TEST(FusedBiasGelu, ADenseLayersGeluOffAGpuIsItsForwardThenGelu) {
  torch::manual_seed(4);
  const torch::Tensor input = torch::randn({4, 6, 24});
  AdaptableLinear dense(24, 32);
  torch::nn::init::normal_(dense->bias);
  EXPECT_TRUE(torch::equal(DenseGelu(dense, input, true), Gelu(dense(input))));
  EXPECT_TRUE(torch::equal(DenseGelu(dense, input, false), Gelu(dense(input))));
}

}  // namespace
}  // namespace trainyard
