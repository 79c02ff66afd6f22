// The fused dropout + residual + LayerNorm entry points off a GPU: they never claim CPU
// tensors, run the unfused composition there (the same values as the modules), and the
// models say which families have fusable blocks. tests/gpu/fused_add_norm_gpu_test.cc
// checks the CUDA kernels themselves.
#include "worker/kernels/fused_add_norm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "tests/worker/numeric_bounds.h"
#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace trainyard {
namespace {

TEST(FusedAddNorm, CpuTensorsTakeTheUnfusedComposition) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({4, 6, 32}), residual = torch::randn({4, 6, 32});
  torch::nn::LayerNorm norm = MakeLayerNorm(32, 1e-12);
  torch::nn::init::normal_(norm->weight);
  EXPECT_FALSE(FusedAddNormApplies(x, residual, norm->weight, norm->bias));
  const torch::Tensor expected = norm(x + residual);
  EXPECT_TRUE(torch::equal(FusedDropoutAddNorm(x, residual, norm->weight, norm->bias, 1e-12, 0.1, false), expected));
  Dropout dropout(0.1);
  dropout->eval();
  EXPECT_TRUE(torch::equal(DropoutAddNorm(norm, dropout, x, residual, true), expected));
  EXPECT_THROW(FusedDropoutAddNormWithMask(x, residual, norm->weight, norm->bias, 1e-12, 0.1, true),
               std::invalid_argument);
}

// With x_bias, the composition adds it to x in x's dtype before the dropout; a dense
// layer's block end off a GPU is the layer's own forward, then the composition.
TEST(FusedAddNorm, CpuTensorsAddTheXBiasInTheComposition) {
  torch::manual_seed(2);
  const torch::Tensor input = torch::randn({4, 6, 24}), residual = torch::randn({4, 6, 32});
  AdaptableLinear dense(24, 32);
  torch::nn::init::normal_(dense->bias);
  torch::nn::LayerNorm norm = MakeLayerNorm(32, 1e-12);
  const torch::Tensor unbiased = torch::linear(input, dense->weight);
  EXPECT_FALSE(FusedAddNormApplies(unbiased, residual, norm->weight, norm->bias, dense->bias));
  EXPECT_FALSE(dense->forward_without_bias(input).has_value()) << "a CPU input takes forward()'s own paths";
  const torch::Tensor expected = norm(dense(input) + residual);
  // The bias goes in after the product rather than inside it: another rounding, which the
  // norm scales by 1/std. Both float32 paths are held against float64 (numeric_bounds.h).
  const auto f64 = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };
  const torch::Tensor exact =
      torch::layer_norm(torch::linear(f64(input), f64(dense->weight), f64(dense->bias)) + f64(residual), {32},
                        f64(norm->weight), f64(norm->bias), 1e-12);
  EXPECT_TRUE(numeric::WithinRoundingOf(
      FusedDropoutAddNorm(unbiased, residual, norm->weight, norm->bias, 1e-12, 0.1, false, dense->bias), expected,
      exact));
  Dropout dropout(0.1);
  dropout->eval();
  EXPECT_TRUE(torch::equal(DenseDropoutAddNorm(dense, norm, dropout, input, residual, true), expected));
}

TEST(FusedAddNorm, EncoderFamiliesHaveFusableBlocksAndTheOthersNone) {
  PresetArgs args;
  args.vocab_size = 100;
  args.max_sequence = 16;
  args.labels = {"a", "b"};
  for (ModelFamily family : {ModelFamily::kBert, ModelFamily::kRoberta}) {
    PresetArgs family_args = args;
    if (family == ModelFamily::kRoberta) {
      family_args.pad_id = 1;
      family_args.bos_id = 0;
      family_args.eos_id = 2;
    }
    Model model = CreateModel(PresetConfig(family, ModelTask::kSequenceClassification, "tiny", family_args),
                              ModelTask::kSequenceClassification);
    EXPECT_EQ(model->set_fused_add_norm(true), 2) << FamilyName(family) << ": tiny has 2 layers";
  }
  Model distilbert =
      CreateModel(PresetConfig(ModelFamily::kDistilBert, ModelTask::kSequenceClassification, "tiny", args),
                  ModelTask::kSequenceClassification);
  EXPECT_EQ(distilbert->set_fused_add_norm(true), 0);
  PresetArgs lm_args = args;
  lm_args.labels.clear();
  Model gpt2 =
      CreateModel(PresetConfig(ModelFamily::kGpt2, ModelTask::kCausalLm, "tiny", lm_args), ModelTask::kCausalLm);
  EXPECT_EQ(gpt2->set_fused_add_norm(true), 0);
}

}  // namespace
}  // namespace trainyard
