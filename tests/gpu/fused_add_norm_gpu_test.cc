// The fused dropout + residual + LayerNorm kernels (worker/kernels/fused_add_norm.h) on a
// GPU, against the unfused ATen composition (labelled gpu; skipped without one). Each
// output is compared relative to its largest magnitude: fp32 outputs within 1e-5;
// outputs stored in bf16 or fp16 within one unit in their last place (2^-7, 2^-10),
// since both sides compute in fp32 but sum in different orders, so a value near a
// rounding boundary may round either way.
//   - without dropout, the value and the four gradients, for hidden sizes 768 and 1000
//     (row per warp, 6 and 8 column groups, the last partly masked), 770 (not a multiple
//     of 4) and 2048 (row per block, the most a block holds), and [B, S, H] as well as
//     [N, H] rows;
//   - inputs one element into their buffer (contiguous, not aligned for 4-wide loads);
//   - x in bf16 or fp16 with an fp32 residual (an autocast step's case), and both in bf16;
//   - with dropout, in both layouts, the kept share within 0.005 of 1 - p over 6 M draws
//     or more, and the value and gradients equal to the composition with that same mask;
//   - captured in a CUDA graph, each replay draws a new mask;
//   - with the producing product's bias passed as x_bias (added in fp32 before the
//     dropout), for both layouts, fp32 and bf16 x, with and without dropout: the value,
//     the gradients and x_bias's gradient;
//   - a BERT classifier with model fused on and off: logits and every parameter's
//     gradient within 1e-4 after one backward (dropout 0);
//   - the same classifier forward only, in eval mode, under NoGradGuard (inference,
//     serving) and InferenceMode (generation), with padded rows: logits within 1e-4.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/gpu/kernel_tolerance.h"
#include "worker/kernels/fused_add_norm.h"
#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace trainyard {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);

struct Inputs {
  torch::Tensor x, residual, weight, bias, dy;
  torch::Tensor x_bias;  // undefined: none
};

Inputs MakeInputs(std::vector<int64_t> shape, torch::Dtype x_type, torch::Dtype residual_type, uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t hidden = shape.back();
  Inputs in;
  in.x = torch::randn(shape, torch::dtype(torch::kFloat).device(kCuda)).mul(2.0).to(x_type);
  in.residual = torch::randn(shape, torch::dtype(torch::kFloat).device(kCuda)).add(0.5).to(residual_type);
  in.weight = torch::rand({hidden}, torch::dtype(torch::kFloat).device(kCuda)).add(0.5);
  in.bias = torch::randn({hidden}, torch::dtype(torch::kFloat).device(kCuda)).mul(0.1);
  in.dy = torch::randn(shape, torch::dtype(torch::kFloat).device(kCuda)).to(residual_type);
  return in;
}

struct Result {
  torch::Tensor y, dx, dresidual, dweight, dbias, keep;
  torch::Tensor dx_bias;  // with Inputs::x_bias
};

// t's values one element into a larger buffer: contiguous, differentiable, and not
// aligned for the row-per-warp kernels' 4-wide loads.
torch::Tensor OneElementIn(const torch::Tensor& t) {
  return torch::cat({t.new_zeros({1}), t.flatten()}).narrow(0, 1, t.numel()).view(t.sizes());
}

Result RunAddNorm(const Inputs& in, double p, bool fused, const torch::Tensor& reference_keep = {},
                  bool misaligned = false) {
  torch::Tensor x = in.x.detach().clone().requires_grad_(true);
  torch::Tensor residual = in.residual.detach().clone().requires_grad_(true);
  torch::Tensor weight = in.weight.detach().clone().requires_grad_(true);
  torch::Tensor bias = in.bias.detach().clone().requires_grad_(true);
  torch::Tensor x_bias = in.x_bias.defined() ? in.x_bias.detach().clone().requires_grad_(true) : torch::Tensor();
  Result r;
  if (fused) {
    const torch::Tensor x_in = misaligned ? OneElementIn(x) : x;
    const torch::Tensor residual_in = misaligned ? OneElementIn(residual) : residual;
    std::tie(r.y, r.keep) = FusedDropoutAddNormWithMask(x_in, residual_in, weight, bias, 1e-12, p, p > 0, x_bias);
  } else {
    // The composition in fp32, as autocast runs LayerNorm; with a given mask when p > 0.
    torch::Tensor dropped = x.to(torch::kFloat);
    if (x_bias.defined()) dropped = dropped + x_bias;
    if (reference_keep.defined()) dropped = dropped * reference_keep.to(torch::kFloat) / (1.0 - p);
    r.y = torch::layer_norm(dropped + residual.to(torch::kFloat), {x.size(-1)}, weight, bias, 1e-12)
              .to(in.residual.scalar_type());
  }
  r.y.backward(in.dy);
  r.dx = x.grad();
  r.dresidual = residual.grad();
  r.dweight = weight.grad();
  r.dbias = bias.grad();
  if (x_bias.defined()) r.dx_bias = x_bias.grad();
  return r;
}

void ExpectClose(const Result& fused, const Result& unfused, const std::string& what) {
  const std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>> outputs[] = {
      {"y", {fused.y, unfused.y}},
      {"dx", {fused.dx, unfused.dx}},
      {"dresidual", {fused.dresidual, unfused.dresidual}},
      {"dweight", {fused.dweight, unfused.dweight}},
      {"dbias", {fused.dbias, unfused.dbias}}};
  for (const auto& [name, pair] : outputs)
    EXPECT_LE(RelativeError(pair.first, pair.second), ToleranceFor(pair.second)) << what << ": " << name;
  ASSERT_EQ(fused.dx_bias.defined(), unfused.dx_bias.defined()) << what;
  // x_bias's gradient is summed over the rows in fp32 on both sides, in different orders.
  if (unfused.dx_bias.defined()) {
    EXPECT_LE(RelativeError(fused.dx_bias, unfused.dx_bias), 1e-4) << what << ": dx_bias";
  }
  EXPECT_EQ(fused.y.scalar_type(), unfused.y.scalar_type()) << what;
  EXPECT_EQ(fused.dx.scalar_type(), unfused.dx.scalar_type()) << what;
}

class FusedAddNormGpu : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible";
    at::globalContext().setAllowTF32CuBLAS(false);  // fp32 products, so 1e-5 means something
  }
};

TEST_F(FusedAddNormGpu, WithoutDropoutMatchesTheCompositionInFp32) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{16, 128, 768}, {300, 1000}, {5, 770}, {7, 2048}, {1, 1, 768}}) {
    const Inputs in = MakeInputs(shape, torch::kFloat, torch::kFloat, 1);
    ASSERT_TRUE(FusedAddNormApplies(in.x, in.residual, in.weight, in.bias));
    ExpectClose(RunAddNorm(in, 0.0, true), RunAddNorm(in, 0.0, false), "fp32 hidden " + std::to_string(shape.back()));
  }
}

TEST_F(FusedAddNormGpu, InputsNotAlignedForWideLoadsMatchTheComposition) {
  for (const torch::Dtype type : {torch::kFloat, torch::kBFloat16}) {
    const Inputs in = MakeInputs({6, 768}, type, torch::kFloat, 5);
    const torch::Tensor shifted = OneElementIn(in.x);
    ASSERT_TRUE(shifted.is_contiguous());
    ASSERT_NE(reinterpret_cast<uintptr_t>(shifted.data_ptr()) % (4 * shifted.element_size()), 0u);
    ExpectClose(RunAddNorm(in, 0.0, true, {}, true), RunAddNorm(in, 0.0, false),
                std::string("misaligned ") + c10::toString(type) + " x");
  }
}

TEST_F(FusedAddNormGpu, HalfPrecisionInputsMatchTheCompositionRoundedOnce) {
  // Both compute in fp32 from the same rounded inputs; what is stored in bf16/fp16 (dx
  // always, y and dresidual when the residual is) rounds once more.
  struct Case {
    torch::Dtype x, residual;
  };
  for (const Case& c : {Case{torch::kBFloat16, torch::kFloat}, Case{torch::kHalf, torch::kFloat},
                        Case{torch::kBFloat16, torch::kBFloat16}}) {
    const Inputs in = MakeInputs({8, 64, 768}, c.x, c.residual, 2);
    ASSERT_TRUE(FusedAddNormApplies(in.x, in.residual, in.weight, in.bias));
    ExpectClose(RunAddNorm(in, 0.0, true), RunAddNorm(in, 0.0, false),
                std::string(c10::toString(c.x)) + " x, " + c10::toString(c.residual) + " residual");
  }
}

TEST_F(FusedAddNormGpu, DropoutKeepsOneMinusPAndMatchesTheCompositionWithItsMask) {
  const double p = 0.1;
  for (const int64_t hidden : {1024, 770}) {  // row per warp, row per block
    const Inputs in = MakeInputs({64, 128, hidden}, torch::kBFloat16, torch::kFloat, 3);
    const Result fused = RunAddNorm(in, p, true);
    ASSERT_TRUE(fused.keep.defined());
    const double kept = fused.keep.to(torch::kDouble).mean().item<double>();
    EXPECT_NEAR(kept, 1.0 - p, 0.005) << "hidden " << hidden << ", over " << fused.keep.numel() << " draws";
    // Rows and columns both vary: a mask repeated across rows would show here.
    EXPECT_FALSE(torch::equal(fused.keep[0][0], fused.keep[0][1])) << "hidden " << hidden;
    EXPECT_FALSE(torch::equal(fused.keep[0][0], fused.keep[1][0])) << "hidden " << hidden;
    ExpectClose(fused, RunAddNorm(in, p, false, fused.keep), "dropout 0.1, hidden " + std::to_string(hidden));
  }
}

TEST_F(FusedAddNormGpu, AnXBiasIsAddedBeforeTheDropoutAndGetsItsGradient) {
  for (const int64_t hidden : {768, 770}) {  // row per warp, row per block
    for (const torch::Dtype type : {torch::kFloat, torch::kBFloat16}) {
      Inputs in = MakeInputs({32, 64, hidden}, type, torch::kFloat, 9);
      in.x_bias = torch::randn({hidden}, torch::dtype(torch::kFloat).device(kCuda));
      ASSERT_TRUE(FusedAddNormApplies(in.x, in.residual, in.weight, in.bias, in.x_bias));
      const std::string what = std::string(c10::toString(type)) + " x, hidden " + std::to_string(hidden);
      ExpectClose(RunAddNorm(in, 0.0, true), RunAddNorm(in, 0.0, false), what);
      const Result dropped = RunAddNorm(in, 0.1, true);
      ASSERT_TRUE(dropped.keep.defined());
      ExpectClose(dropped, RunAddNorm(in, 0.1, false, dropped.keep), what + ", dropout 0.1");
    }
  }
  // An x_bias of the wrong size or dtype is not for the fused kernels.
  const Inputs in = MakeInputs({4, 768}, torch::kFloat, torch::kFloat, 10);
  EXPECT_FALSE(FusedAddNormApplies(in.x, in.residual, in.weight, in.bias, in.bias.narrow(0, 0, 767)));
  EXPECT_FALSE(FusedAddNormApplies(in.x, in.residual, in.weight, in.bias, in.bias.to(torch::kBFloat16)));
}

TEST_F(FusedAddNormGpu, EachGraphReplayDrawsANewMask) {
  const Inputs in = MakeInputs({32, 768}, torch::kFloat, torch::kFloat, 4);
  at::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  torch::Tensor keep;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    FusedDropoutAddNormWithMask(in.x, in.residual, in.weight, in.bias, 1e-12, 0.5, true);  // warm-up
    graph.capture_begin();
    keep = FusedDropoutAddNormWithMask(in.x, in.residual, in.weight, in.bias, 1e-12, 0.5, true).second;
    graph.capture_end();
  }
  graph.replay();
  torch::cuda::synchronize();
  const torch::Tensor first = keep.clone();
  graph.replay();
  torch::cuda::synchronize();
  EXPECT_FALSE(torch::equal(first, keep)) << "two replays drew the same mask";
  EXPECT_NEAR(keep.to(torch::kDouble).mean().item<double>(), 0.5, 0.05);
}

TEST_F(FusedAddNormGpu, ABertClassifierGivesTheSameLogitsAndGradientsFusedOrNot) {
  PresetArgs args;
  args.vocab_size = 500;
  args.max_sequence = 64;
  args.labels = {"a", "b", "c"};
  nlohmann::json config = PresetConfig(ModelFamily::kBert, ModelTask::kSequenceClassification, "mini", args);
  SetDropout(&config, 0.0);
  torch::manual_seed(5);
  const torch::Tensor ids = torch::randint(5, 500, {8, 64}, torch::kLong).to(kCuda);
  const torch::Tensor mask = torch::ones({8, 64}, torch::kLong).to(kCuda);
  const torch::Tensor labels = torch::randint(0, 3, {8}, torch::kLong).to(kCuda);
  std::vector<torch::Tensor> logits;
  std::vector<std::vector<torch::Tensor>> grads;
  for (bool fused : {false, true}) {
    torch::manual_seed(6);
    Model model = CreateModel(config, ModelTask::kSequenceClassification);
    model->to(kCuda);
    model->train();
    EXPECT_EQ(model->set_fused_add_norm(fused), 4);  // mini: 4 layers
    torch::Tensor out = model->forward(ids, mask);
    torch::nn::functional::cross_entropy(out, labels).backward();
    logits.push_back(out.detach());
    grads.emplace_back();
    for (const torch::Tensor& param : model->parameters())
      grads.back().push_back(param.grad().defined() ? param.grad().detach() : torch::zeros_like(param));
  }
  EXPECT_LE(RelativeError(logits[1], logits[0]), 1e-4);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_LE(RelativeError(grads[1][i], grads[0][i]), 1e-4) << i;
}

// The forward-only paths (evaluation, serving and generation run without autograd):
// the fused function must neither need a graph nor leave one behind.
TEST_F(FusedAddNormGpu, ForwardOnlyUnderNoGradAndInferenceModeGivesTheUnfusedLogits) {
  PresetArgs args;
  args.vocab_size = 500;
  args.max_sequence = 64;
  args.labels = {"a", "b", "c"};
  const nlohmann::json config = PresetConfig(ModelFamily::kBert, ModelTask::kSequenceClassification, "mini", args);
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(5, 500, {4, 64}, torch::kLong).to(kCuda);
  torch::Tensor mask = torch::ones({4, 64}, torch::kLong);
  mask.index_put_({torch::indexing::Slice(1, 4), torch::indexing::Slice(40, 64)}, 0);  // padded rows
  mask = mask.to(kCuda);
  for (bool inference_mode : {false, true}) {
    std::vector<torch::Tensor> logits;
    for (bool fused : {false, true}) {
      torch::manual_seed(8);
      Model model = CreateModel(config, ModelTask::kSequenceClassification);
      model->to(kCuda);
      model->eval();
      EXPECT_EQ(model->set_fused_add_norm(fused), 4);
      torch::Tensor out;
      if (inference_mode) {
        torch::InferenceMode guard;
        out = model->forward(ids, mask);
      } else {
        torch::NoGradGuard guard;
        out = model->forward(ids, mask);
        EXPECT_FALSE(out.requires_grad());
      }
      logits.push_back(out.clone());
    }
    EXPECT_LE(RelativeError(logits[1], logits[0]), 1e-4) << (inference_mode ? "InferenceMode" : "NoGradGuard");
  }
}

}  // namespace
}  // namespace trainyard
