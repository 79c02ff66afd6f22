// Attention over packed tokens on a GPU (worker/kernels/varlen_attention.h, and the
// encoders' path through it, worker/models/token_index.h), labelled gpu; skipped without
// one. Each bf16 result is held against the same computation in fp32 on the same bf16
// inputs, and may be off from it by a few units in bf16's last place (2^-7) of the
// largest magnitude:
//   - VarlenAttention against attention per sequence (sequences of 5, 0, 17, 128, 1 and
//     64 tokens, 12 heads of 64): the output and the gradients of q, k and v;
//   - queries at each sequence's first token only (an encoder's last layer under a
//     classifier), with empty filler sequences after the rows;
//   - a BERT classifier under bf16 autocast over host-packed batches (PackTokens with
//     filler, so ForwardPacked takes the varlen kernel) against the same model on the
//     padded batch: the logits and every parameter's gradient, each no further from the
//     fp32 padded run than twice the padded bf16 run's own distance from it;
//   - the packed forward captured as a CUDA graph and replayed on another batch of the
//     same packed count gives that batch's eager logits.
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tests/gpu/kernel_tolerance.h"
#include "worker/kernels/varlen_attention.h"
#include "worker/models/model.h"
#include "worker/models/token_index.h"

namespace trainyard {
namespace {

const torch::Device kCuda(torch::kCUDA, 0);
constexpr int64_t kHeads = 12, kHead = 64;

class VarlenAttentionGpu : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

torch::Tensor Starts(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> starts{0};
  for (int64_t length : lengths) starts.push_back(starts.back() + static_cast<int32_t>(length));
  return torch::tensor(starts, torch::kInt).to(kCuda);
}

// softmax(q k^T / sqrt(D)) v sequence by sequence, in fp32, from the same bf16 values.
torch::Tensor PerSequence(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const std::vector<int64_t>& lengths) {
  std::vector<torch::Tensor> outputs;
  int64_t start = 0;
  for (int64_t length : lengths) {
    if (length > 0) {
      auto part = [&](const torch::Tensor& t) {
        return t.narrow(0, start, length).to(torch::kFloat).transpose(0, 1).unsqueeze(0);  // [1, heads, L, D]
      };
      torch::Tensor out = at::scaled_dot_product_attention(part(q), part(k), part(v));
      outputs.push_back(out.squeeze(0).transpose(0, 1));
    }
    start += length;
  }
  return torch::cat(outputs);
}

TEST_F(VarlenAttentionGpu, EqualsAttentionPerSequenceWithItsGradients) {
  const std::vector<int64_t> lengths{5, 0, 17, 128, 1, 64};
  const int64_t tokens = 215;
  torch::manual_seed(3);
  auto make = [&] { return torch::randn({tokens, kHeads, kHead}, kCuda).to(torch::kBFloat16).requires_grad_(); };
  torch::Tensor q = make(), k = make(), v = make();
  ASSERT_TRUE(VarlenAttentionApplies(q, k, v));
  const torch::Tensor starts = Starts(lengths);
  torch::Tensor out = VarlenAttention(q, k, v, starts, starts, 128, 128, 0.0);
  ASSERT_EQ(out.sizes(), q.sizes());
  torch::Tensor dy = torch::randn_like(out);
  const auto grads = torch::autograd::grad({out}, {q, k, v}, {dy});

  torch::Tensor q32 = q.detach().to(torch::kFloat).requires_grad_(),
                k32 = k.detach().to(torch::kFloat).requires_grad_(),
                v32 = v.detach().to(torch::kFloat).requires_grad_();
  torch::Tensor expected = PerSequence(q32, k32, v32, lengths);
  const auto expected_grads = torch::autograd::grad({expected}, {q32, k32, v32}, {dy.to(torch::kFloat)});
  const double tolerance = 4 * ToleranceFor(out);
  EXPECT_LE(RelativeError(out, expected), tolerance);
  for (int i = 0; i < 3; ++i) EXPECT_LE(RelativeError(grads[i], expected_grads[i]), tolerance) << "gradient " << i;
}

TEST_F(VarlenAttentionGpu, FirstQueriesAloneWithEmptyFillerSequences) {
  const std::vector<int64_t> lengths{9, 40, 3};
  torch::manual_seed(4);
  auto make = [](int64_t rows) { return torch::randn({rows, kHeads, kHead}, kCuda).to(torch::kBFloat16); };
  torch::Tensor k = make(52), v = make(52);
  torch::Tensor first = torch::tensor({0, 9, 49}, torch::kLong).to(kCuda);
  torch::Tensor q = make(52);
  // Keys: the three rows, then two empty filler sequences; queries: one per row.
  torch::Tensor k_starts = torch::tensor({0, 9, 49, 52, 52, 52}, torch::kInt).to(kCuda);
  torch::Tensor q_starts = torch::tensor({0, 1, 2, 3, 3, 3}, torch::kInt).to(kCuda);
  torch::Tensor out = VarlenAttention(q.index_select(0, first), k, v, q_starts, k_starts, 1, 64, 0.0);
  torch::Tensor expected = PerSequence(q, k, v, lengths).index_select(0, first);
  EXPECT_LE(RelativeError(out, expected), 4 * ToleranceFor(out));
}

// Right-padded rows of random lengths 1..seq, the first full.
std::pair<torch::Tensor, torch::Tensor> RandomBatch(int64_t batch, int64_t seq, int64_t seed) {
  auto generator = torch::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor lengths = torch::randint(1, seq + 1, {batch}, generator, torch::kLong);
  lengths[0] = seq;
  torch::Tensor mask = torch::arange(seq).unsqueeze(0).lt(lengths.unsqueeze(1)).to(torch::kLong);
  torch::Tensor ids = torch::randint(5, 1000, {batch, seq}, generator, torch::kLong) * mask;
  return {ids, mask};
}

Model BertMini() {
  PresetArgs args;
  args.vocab_size = 1000;
  args.max_sequence = 128;
  args.labels = {"a", "b", "c"};
  nlohmann::json config = PresetConfig(ModelFamily::kBert, ModelTask::kSequenceClassification, "mini", args);
  SetDropout(&config, 0.0);
  torch::manual_seed(5);
  Model model = CreateModel(config, ModelTask::kSequenceClassification);
  model->to(kCuda);
  return model;
}

struct Outcome {
  torch::Tensor logits;
  std::map<std::string, torch::Tensor> grads;
};

// Logits and gradients (of the logits' sum of squares) over the batch: padded, or
// through `packing` (on the device).
Outcome RunModel(Model& model, const torch::Tensor& ids, const torch::Tensor& mask, const TokenPacking* packing,
                 bool bf16) {
  model->zero_grad();
  torch::Tensor logits;
  {
    at::autocast::set_autocast_enabled(at::kCUDA, bf16);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    logits = packing ? model->ForwardPacked(ids, mask, *packing) : model->forward(ids, mask);
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  logits = logits.to(torch::kFloat);
  logits.pow(2).sum().backward();
  Outcome out{logits.detach(), {}};
  for (const auto& item : model->named_parameters()) out.grads[item.key()] = item.value().grad().clone();
  return out;
}

double Distance(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).to(torch::kDouble).norm().item<double>() / std::max(1e-12, b.to(torch::kDouble).norm().item<double>());
}

TEST_F(VarlenAttentionGpu, PackedBertUnderAutocastIsAsCloseToFp32AsThePaddedOne) {
  Model model = BertMini();
  model->set_unpadding(Unpadding::kNever);
  auto [ids, mask] = RandomBatch(16, 128, 7);
  const TokenPacking packing = PackTokens(mask, GraphTokenGranule(16, 128)).To(kCuda, false);
  ids = ids.to(kCuda);
  mask = mask.to(kCuda);
  const Outcome exact = RunModel(model, ids, mask, nullptr, false);
  const Outcome padded = RunModel(model, ids, mask, nullptr, true);
  const Outcome packed = RunModel(model, ids, mask, &packing, true);
  const double floor = 1.0 / 256;  // bf16's rounding of one value
  EXPECT_LE(Distance(packed.logits, exact.logits), 2 * Distance(padded.logits, exact.logits) + floor);
  for (const auto& [name, grad] : exact.grads) {
    if (name.find("attention.self.key.bias") != std::string::npos) continue;  // zero but for rounding
    EXPECT_LE(Distance(packed.grads.at(name), grad), 2 * Distance(padded.grads.at(name), grad) + floor) << name;
  }
}

TEST_F(VarlenAttentionGpu, CapturedPackedForwardReplaysAnotherBatchOfTheSameCount) {
  Model model = BertMini();
  model->eval();
  torch::NoGradGuard no_grad;
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  auto [ids_a, mask_a] = RandomBatch(8, 64, 11);
  // The second batch: the first's rows in reverse order, so the same count, other starts.
  torch::Tensor ids_b = ids_a.flip(0).contiguous(), mask_b = mask_a.flip(0).contiguous();
  const int64_t granule = GraphTokenGranule(8, 64);
  TokenPacking a = PackTokens(mask_a, granule).To(kCuda, false), b = PackTokens(mask_b, granule).To(kCuda, false);
  ASSERT_EQ(a.index.size(0), b.index.size(0));
  ASSERT_FALSE(a.starts.equal(b.starts));
  torch::Tensor ids = ids_a.to(kCuda), mask = mask_a.to(kCuda);
  TokenPacking inputs = a;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  side.synchronize();
  torch::Tensor out;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    model->ForwardPacked(ids, mask, inputs);  // warm-up outside the capture
    graph.capture_begin();
    out = model->ForwardPacked(ids, mask, inputs);
    graph.capture_end();
  }
  side.synchronize();
  ids.copy_(ids_b.to(kCuda));
  mask.copy_(mask_b.to(kCuda));
  inputs.index.copy_(b.index);
  inputs.starts.copy_(b.starts);
  graph.replay();
  torch::cuda::synchronize();
  torch::Tensor eager = model->ForwardPacked(ids_b.to(kCuda), mask_b.to(kCuda), b);
  EXPECT_LE(RelativeError(out.to(torch::kFloat), eager.to(torch::kFloat)), 1e-3);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
}

}  // namespace
}  // namespace trainyard
