#include "worker/models/layers.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/worker/models/cast_copies.h"
#include "tests/worker/numeric_bounds.h"
#include "worker/models/model.h"
#include "worker/train/amp.h"

namespace trainyard {
namespace {

TEST(ApplyDropout, KeepsOneMinusPScaledAndIsIdentityWhenOff) {
  torch::manual_seed(1);
  torch::Tensor x = torch::ones({1000, 1000});
  torch::Tensor y = ApplyDropout(x, 0.25, /*training=*/true);
  const double kept = y.ne(0).to(torch::kDouble).mean().item<double>();
  // A million kept-or-not draws: the kept fraction's standard deviation is
  // sqrt(0.75 x 0.25 / 1e6) = 4.3e-4, so 0.002 is 4.6 of them. The kept values are one
  // float32 rounding of 1/0.75, far inside allclose's default 1e-5 relative.
  EXPECT_NEAR(kept, 0.75, 0.002);
  EXPECT_TRUE(y.masked_select(y.ne(0)).allclose(torch::full({1}, 1.0 / 0.75)));
  EXPECT_TRUE(ApplyDropout(x, 0.25, /*training=*/false).equal(x));
  EXPECT_TRUE(ApplyDropout(x, 0.0, /*training=*/true).equal(x));
}

TEST(ApplyDropout, MasksFollowTheGeneratorNotTheThreadCount) {
  torch::Tensor x = torch::ones({300, 777});
  const int threads = at::get_num_threads();
  torch::manual_seed(7);
  torch::Tensor first = ApplyDropout(x, 0.1, true), second = ApplyDropout(x, 0.1, true);
  at::set_num_threads(1);
  torch::manual_seed(7);
  torch::Tensor one_thread = ApplyDropout(x, 0.1, true);
  at::set_num_threads(threads);
  EXPECT_TRUE(first.equal(one_thread));
  EXPECT_FALSE(first.equal(second));  // each call draws a new seed
}

TEST(ApplyDropout, GradientIsTheMask) {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({64, 64}, torch::requires_grad());
  torch::Tensor y = ApplyDropout(x, 0.5, true);
  y.sum().backward();
  EXPECT_TRUE(x.grad().equal(y.detach() / x.detach()));
}

TEST(Gelu, ValueAndGradientEqualAtensOnEveryRangeAndLength) {
  // Tails past exp's floor, zero, and a length that leaves a remainder after the
  // vector loop; several thread slices.
  torch::Tensor u =
      torch::cat({torch::linspace(-20, 20, 40001), torch::randn({100003}) * 4, torch::zeros({3})}).requires_grad_(true);
  const torch::Tensor weights = torch::randn({u.size(0)});
  const torch::Tensor ours = Gelu(u);
  const torch::Tensor ours_grad = torch::autograd::grad({(ours * weights).sum()}, {u})[0];
  const torch::Tensor aten = torch::gelu(u);
  const torch::Tensor aten_grad = torch::autograd::grad({(aten * weights).sum()}, {u})[0];
  EXPECT_LT((ours - aten).abs().max().item<float>(), 2e-6);
  EXPECT_LT((ours_grad - aten_grad).abs().max().item<float>(), 2e-6);
  // Without a gradient to take it is ATen's own.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(Gelu(u).equal(torch::gelu(u)));
}

TEST(MultiHeadAttention, DropoutPathEqualsSdpaWhenNothingIsDropped) {
  // With p tiny the manual path keeps (almost surely) every probability, so it must
  // equal SDPA's result up to rounding, masks and causality included: as close to the
  // fp64 attention as SDPA's own fp32 result is (tests/worker/numeric_bounds.h).
  torch::manual_seed(5);
  torch::Tensor q = torch::randn({2, 6, 16}), k = torch::randn({2, 6, 16}), v = torch::randn({2, 6, 16});
  torch::Tensor keep = torch::tensor({1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1}, torch::kBool).view({2, 1, 1, 6});
  for (bool causal : {false, true}) {
    torch::Tensor reference = MultiHeadAttention(q, k, v, 4, keep, 0.0, causal);
    torch::Tensor exact =
        MultiHeadAttention(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), 4, keep, 0.0, causal);
    torch::Tensor manual = MultiHeadAttention(q, k, v, 4, keep, 1e-12, causal) * (1.0 - 1e-12);
    EXPECT_TRUE(numeric::WithinRoundingOf(manual, reference, exact)) << "causal " << causal;
  }
}

// bf16 attention on the CPU: PyTorch's flash kernel natively, SDPA's math path where
// ATen is held below AVX-512 on a CPU with AMX (ScaledDotProductAttention), which the CI
// pass under ATEN_CPU_CAPABILITY=default runs. Either is the fp64 attention of the same
// bf16 inputs, rounded: at worst (the math path) the scores, the probabilities and the
// output are each rounded to bf16's 8 bits (2^-9 relative), and softmax turns a score's
// rounding into a relative change of its probability of up to |score| x 2^-9. So the
// bound is (2 + max |score|) x 2^-9 of the largest output, doubled.
TEST(MultiHeadAttention, Bf16OnTheCpuIsTheFp64AttentionRounded) {
  torch::manual_seed(6);
  const auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  torch::Tensor q = bf16(torch::randn({3, 10, 32})), k = bf16(torch::randn({3, 10, 32})),
                v = bf16(torch::randn({3, 10, 32}));
  torch::Tensor keep = torch::ones({3, 1, 1, 10}, torch::kBool);
  keep.narrow(3, 7, 3)[1].fill_(false);
  const auto wide = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const double max_score = (wide(q)
                                .view({3, 10, 4, 8})
                                .transpose(1, 2)
                                .matmul(wide(k).view({3, 10, 4, 8}).transpose(1, 2).transpose(-1, -2)) /
                            std::sqrt(8.0))
                               .abs()
                               .max()
                               .item<double>();
  for (bool causal : {false, true}) {
    torch::Tensor out = MultiHeadAttention(q, k, v, 4, keep, 0.0, causal);
    torch::Tensor exact = MultiHeadAttention(wide(q), wide(k), wide(v), 4, keep, 0.0, causal);
    ASSERT_EQ(out.scalar_type(), torch::kBFloat16);
    const double bound = 2 * (2 + max_score) * std::ldexp(1.0, -9) * exact.abs().max().item<double>();
    EXPECT_LE(numeric::MaxAbsDiff(out, exact), bound) << "causal " << causal;
  }
}

// HF's BERT and RoBERTa heads drop with config.classifier_dropout when it is set, else
// with hidden_dropout_prob; a job's dropout setting covers it too.
double HeadDropout(const nlohmann::json& config) {
  Model model = CreateModel(config, ModelTask::kSequenceClassification);
  return model->named_modules()["dropout"]->as<DropoutImpl>()->p();
}

TEST(ClassifierDropout, IsHfsClassifierDropoutElseTheHiddenOne) {
  PresetArgs args;
  args.vocab_size = 100;
  args.labels = {"a", "b"};
  for (ModelFamily family : {ModelFamily::kBert, ModelFamily::kRoberta}) {
    nlohmann::json config = PresetConfig(family, ModelTask::kSequenceClassification, "tiny", args);
    config["hidden_dropout_prob"] = 0.1;
    config["classifier_dropout"] = nullptr;
    EXPECT_DOUBLE_EQ(HeadDropout(config), 0.1) << FamilyName(family);
    config["classifier_dropout"] = 0.3;
    EXPECT_DOUBLE_EQ(HeadDropout(config), 0.3) << FamilyName(family);
    Model model = CreateModel(config, ModelTask::kSequenceClassification);
    EXPECT_DOUBLE_EQ(model->HfConfig()["classifier_dropout"].get<double>(), 0.3) << "written back";
    SetDropout(&config, 0.0);
    EXPECT_DOUBLE_EQ(HeadDropout(config), 0.0) << "a job's dropout: 0 turns the head's off too";
    config["classifier_dropout"] = 1.5;
    EXPECT_THROW(CreateModel(config, ModelTask::kSequenceClassification), std::runtime_error);
  }
}

// Logits of `model` on a fixed batch, in bf16 autocast on the CPU, without gradients.
torch::Tensor Bf16Logits(Model& model) {
  torch::NoGradGuard no_grad;
  AutocastScope autocast(torch::kCPU, Precision::kBf16);
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(1, 100, {3, 11});
  torch::Tensor mask = torch::ones({3, 11}, torch::kLong);
  mask.narrow(1, 8, 3).select(0, 1).zero_();  // a padded row
  return model->forward(ids, mask);
}

// A frozen model casts each weight once and gives autocast's logits to the bit: the
// same model with weights that train (cast by autocast on every pass) is the reference.
TEST(ComputeDtypeWeights, AFrozenModelGivesAutocastsLogitsCastingOnce) {
  PresetArgs args;
  args.vocab_size = 100;
  args.labels = {"a", "b", "c"};
  args.pad_id = 0;
  const std::vector<std::pair<ModelFamily, ModelTask>> models = {
      {ModelFamily::kBert, ModelTask::kSequenceClassification},
      {ModelFamily::kRoberta, ModelTask::kSequenceClassification},
      {ModelFamily::kDistilBert, ModelTask::kSequenceClassification},
      {ModelFamily::kGpt2, ModelTask::kSequenceClassification},
      {ModelFamily::kGpt2, ModelTask::kCausalLm}};
  for (const auto& [family, task] : models) {
    SCOPED_TRACE(std::string(FamilyName(family)) + (task == ModelTask::kCausalLm ? " causal LM" : " classifier"));
    torch::manual_seed(1);
    Model model = CreateModel(PresetConfig(family, task, "tiny", args), task);
    model->eval();
    const torch::Tensor autocasts = Bf16Logits(model);
    EXPECT_EQ(trainyard::testing::CastCopiesMade(model), 0) << "weights that train are cast by autocast";
    Freeze(*model);
    const torch::Tensor first = Bf16Logits(model);
    const int64_t made = trainyard::testing::CastCopiesMade(model);
    EXPECT_GT(made, 0);
    const torch::Tensor second = Bf16Logits(model);
    EXPECT_EQ(trainyard::testing::CastCopiesMade(model), made) << "the second pass casts nothing";
    EXPECT_EQ(first.scalar_type(), autocasts.scalar_type());
    EXPECT_TRUE(torch::equal(first, autocasts)) << "max diff " << (first - autocasts).abs().max().item<float>();
    EXPECT_TRUE(torch::equal(second, autocasts));
  }
}

}  // namespace
}  // namespace trainyard
