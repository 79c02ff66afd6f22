// Unpadded training (TokenIndex: dense layers over the real tokens only) against padded
// training of the same model on the same batches: the parameters after 20 AdamW steps,
// and the hidden states of the real tokens. The same for batches the host packed
// (PackTokens, with filler up to a granule, through ForwardPacked), and what PackTokens
// and a TokenIndex built from it hold. In fp64, where only the order of the sums
// can differ, they agree within 1e-9. In fp32 each unpadded result is held against the
// same computation in fp64 and may be off from it by no more than a small multiple of
// the padded path's own fp32 error there (tests/worker/numeric_bounds.h), so the bound
// follows this CPU's kernels rather than one CPU's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/worker/numeric_bounds.h"
#include "worker/models/bert.h"
#include "worker/models/layers.h"
#include "worker/models/model.h"
#include "worker/models/token_index.h"
#include "worker/train/amp.h"
#include "worker/train/optimizer.h"

namespace trainyard {
namespace {

using numeric::EqualInFloat64;
using numeric::SameProduct;
using numeric::WithinRoundingOf;

constexpr int64_t kVocab = 300, kBatch = 8, kSeq = 24;

struct Batch {
  torch::Tensor ids, mask, labels;
};

// Right-padded rows of random lengths 2..kSeq, the first row full.
Batch RandomBatch(torch::Generator& generator, int64_t pad_id) {
  torch::Tensor lengths = torch::randint(2, kSeq + 1, {kBatch}, generator, torch::kLong);
  lengths[0] = kSeq;
  torch::Tensor mask = torch::arange(kSeq).unsqueeze(0).lt(lengths.unsqueeze(1)).to(torch::kLong);
  torch::Tensor ids = torch::randint(5, kVocab, {kBatch, kSeq}, generator, torch::kLong);
  ids = torch::where(mask.to(torch::kBool), ids, torch::full_like(ids, pad_id));
  return {ids, mask, torch::randint(0, 3, {kBatch}, generator, torch::kLong)};
}

nlohmann::json TinyConfig(ModelFamily family) {
  PresetArgs args;
  args.vocab_size = kVocab;
  args.max_sequence = kSeq;
  if (family == ModelFamily::kRoberta) {
    args.pad_id = 1;
    args.bos_id = 0;
    args.eos_id = 2;
  }
  args.labels = {"a", "b", "c"};
  nlohmann::json config = PresetConfig(family, ModelTask::kSequenceClassification, "tiny", args);
  SetDropout(&config, 0.0);  // dropout masks are drawn per element, so their layout differs
  return config;
}

// The parameters after `steps` AdamW steps (clipped at 1.0, as the trainer does) on the
// same seeded batches, with the model built from one seed.
// host_granule > 0: each batch packed on the host with that granule (ForwardPacked).
std::map<std::string, torch::Tensor> Train(ModelFamily family, Unpadding policy, int steps,
                                           torch::Dtype dtype = torch::kFloat, int64_t host_granule = 0) {
  torch::manual_seed(11);
  Model model = CreateModel(TinyConfig(family), ModelTask::kSequenceClassification);
  model->to(dtype);
  model->set_unpadding(policy);
  AdamW optimizer(model->named_parameters().pairs(), AdamWOptions{});
  std::vector<torch::Tensor> params = model->parameters();
  auto generator = torch::make_generator<at::CPUGeneratorImpl>(5);
  for (int step = 0; step < steps; ++step) {
    Batch batch = RandomBatch(generator, model->info().pad_id);
    EXPECT_TRUE(TokenIndex::Worth(batch.mask)) << "the batches should be padded enough for auto to unpad";
    torch::Tensor logits = host_granule > 0
                               ? model->ForwardPacked(batch.ids, batch.mask, PackTokens(batch.mask, host_granule))
                               : model->forward(batch.ids, batch.mask);
    torch::nn::functional::cross_entropy(logits, batch.labels).backward();
    ClipGradNorm(params, 1.0);
    optimizer.Step(1e-3);
    optimizer.ZeroGrad();
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

class UnpaddedTraining : public testing::TestWithParam<ModelFamily> {};

// The attention key bias shifts every score of a query alike, which softmax ignores, so
// its gradient is zero but for rounding, and Adam's normalisation turns that rounding into
// steps of size lr: in fp32 the two runs' key biases drift apart by ~1e-5 from rounding
// alone. fp64 shrinks the rounding below Adam's eps and checks them too.
bool IsKeyBias(const std::string& name) {
  for (const char* key : {"attention.self.key.bias", "attention.k_lin.bias"})
    if (name.find(key) != std::string::npos) return true;
  return false;
}

double LargestChange(const std::map<std::string, torch::Tensor>& from, const std::map<std::string, torch::Tensor>& to) {
  double largest = 0;
  for (const auto& [name, value] : from) largest = std::max(largest, (value - to.at(name)).abs().max().item<double>());
  return largest;
}

TEST_P(UnpaddedTraining, EqualsPaddedTrainingAfter20Steps) {
  const auto padded = Train(GetParam(), Unpadding::kNever, 20);
  const auto unpadded = Train(GetParam(), Unpadding::kAlways, 20);
  const auto exact = Train(GetParam(), Unpadding::kNever, 20, torch::kDouble);
  ASSERT_EQ(padded.size(), unpadded.size());
  for (const auto& [name, value] : padded) {
    if (IsKeyBias(name)) continue;
    EXPECT_TRUE(WithinRoundingOf(unpadded.at(name), value, exact.at(name))) << name;
  }
  EXPECT_GT(LargestChange(padded, Train(GetParam(), Unpadding::kNever, 0)), 1e-3) << "training should move weights";
}

TEST_P(UnpaddedTraining, EqualsPaddedTrainingAfter20StepsInFp64) {
  const auto padded = Train(GetParam(), Unpadding::kNever, 20, torch::kDouble);
  const auto unpadded = Train(GetParam(), Unpadding::kAlways, 20, torch::kDouble);
  EXPECT_LE(LargestChange(padded, unpadded), 1e-9);
}

// Filler rows (padding positions packed to fill the granule) reach no real token: the
// scattered attention hides them as keys, and the head reads each row's position 0.
TEST_P(UnpaddedTraining, HostPackedBatchesWithFillerEqualPaddedTrainingInFp64) {
  const auto padded = Train(GetParam(), Unpadding::kNever, 20, torch::kDouble);
  for (int64_t granule : std::vector<int64_t>{1, 16, GraphTokenGranule(kBatch, kSeq)})
    EXPECT_LE(LargestChange(padded, Train(GetParam(), Unpadding::kNever, 20, torch::kDouble, granule)), 1e-9)
        << "granule " << granule;
}

INSTANTIATE_TEST_SUITE_P(Families, UnpaddedTraining,
                         testing::Values(ModelFamily::kBert, ModelFamily::kRoberta, ModelFamily::kDistilBert),
                         [](const auto& info) { return std::string(FamilyName(info.param)); });

TEST(TokenIndex, PackAndUnpackMoveTheRealRowsOnly) {
  torch::Tensor mask = torch::tensor({1, 1, 0, 1, 0, 0}, torch::kLong).view({2, 3});
  torch::Tensor padded = torch::arange(12, torch::kFloat).view({2, 3, 2});
  TokenIndex tokens(mask);
  EXPECT_EQ(tokens.tokens(), 3);
  EXPECT_TRUE(tokens.Pack(padded).equal(torch::tensor({0, 1, 2, 3, 6, 7}, torch::kFloat).view({3, 2})));
  torch::Tensor expected = padded * mask.unsqueeze(2);
  EXPECT_TRUE(tokens.Unpack(tokens.Pack(padded)).equal(expected));
}

TEST(TokenIndex, AutoUnpadsOnlyWhenPaddingIsWorthSkipping) {
  torch::Tensor full = torch::ones({4, 10}, torch::kLong);
  torch::Tensor little = full.clone(), much = full.clone();
  little[0][9] = 0;  // 1 in 40 padded
  much.narrow(1, 5, 5).zero_();
  EXPECT_FALSE(TokenIndex::Wanted(Unpadding::kAuto, full, KeyKeepMask(full)));
  EXPECT_FALSE(TokenIndex::Wanted(Unpadding::kAuto, little, KeyKeepMask(little)));
  EXPECT_TRUE(TokenIndex::Wanted(Unpadding::kAuto, much, KeyKeepMask(much)));
  EXPECT_TRUE(TokenIndex::Wanted(Unpadding::kAlways, little, KeyKeepMask(little)));
  EXPECT_FALSE(TokenIndex::Wanted(Unpadding::kNever, much, KeyKeepMask(much)));
  EXPECT_THROW(UnpaddingNamed("sometimes"), std::invalid_argument);
}

// A tiny BERT encoder built from `seed`, in fp32 or in fp64 (the same weights, widened).
BertEncoder TinyEncoder(uint64_t seed, torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  BertEncoder encoder(BertConfig::FromJson(TinyConfig(ModelFamily::kBert)), PositionIds::kFromZero, true);
  encoder->to(dtype);
  return encoder;
}

TEST(TokenIndex, EncoderHiddenStatesOfRealTokensDoNotDependOnUnpadding) {
  BertEncoder encoder = TinyEncoder(3), wide = TinyEncoder(3, torch::kDouble);
  encoder->eval();
  wide->eval();
  auto generator = torch::make_generator<at::CPUGeneratorImpl>(9);
  Batch batch = RandomBatch(generator, 0);
  torch::Tensor padded = encoder->forward(batch.ids, batch.mask, Unpadding::kNever);
  torch::Tensor unpadded = encoder->forward(batch.ids, batch.mask, Unpadding::kAlways);
  torch::Tensor exact = wide->forward(batch.ids, batch.mask, Unpadding::kNever);
  torch::Tensor real = batch.mask.to(torch::kBool).unsqueeze(2).expand_as(padded);
  EXPECT_TRUE(WithinRoundingOf(unpadded.masked_select(real), padded.masked_select(real), exact.masked_select(real)));
  EXPECT_EQ(unpadded.masked_select(real.logical_not()).abs().max().item<float>(), 0.0f);
  EXPECT_GT(padded.masked_select(real.logical_not()).abs().max().item<float>(), 0.0f);
}

// The last layer's position 0 and the parameters' gradients through it, computed over
// the full last layer or (Rows::kFirst) over its first row alone.
struct FirstRow {
  torch::Tensor value;
  std::vector<torch::Tensor> grads;
};

FirstRow FirstRowAndGrads(BertEncoder& encoder, const Batch& batch, Unpadding policy, Rows rows,
                          const torch::Tensor& weights) {
  torch::Tensor out = encoder->forward(batch.ids, batch.mask, policy, rows);
  if (rows == Rows::kAll) out = out.narrow(1, 0, 1);
  const auto grads = torch::autograd::grad({(out * weights.to(out.scalar_type())).sum()}, encoder->parameters(), {},
                                           false, false, true);
  return {out.detach(), grads};
}

// The first row's path sums over fewer rows than the full layer's, so the two round
// differently; in fp64 they agree to rounding, and in fp32 the first row's results are as
// close to the fp64 ones as the full layer's are.
TEST(Rows, FirstPositionAloneEqualsItsRowOfTheFullLastLayerWithGradients) {
  BertEncoder encoder = TinyEncoder(5), wide = TinyEncoder(5, torch::kDouble);
  auto generator = torch::make_generator<at::CPUGeneratorImpl>(9);
  Batch batch = RandomBatch(generator, 0);
  const torch::Tensor weights = torch::randn({kBatch, 1, encoder->parameters()[0].size(1)});
  for (Unpadding policy : {Unpadding::kNever, Unpadding::kAlways}) {
    const FirstRow full = FirstRowAndGrads(encoder, batch, policy, Rows::kAll, weights);
    const FirstRow first = FirstRowAndGrads(encoder, batch, policy, Rows::kFirst, weights);
    const FirstRow exact = FirstRowAndGrads(wide, batch, policy, Rows::kAll, weights);
    const FirstRow exact_first = FirstRowAndGrads(wide, batch, policy, Rows::kFirst, weights);
    ASSERT_EQ(first.value.sizes(), full.value.sizes());
    EXPECT_TRUE(WithinRoundingOf(first.value, full.value, exact.value));
    EXPECT_TRUE(EqualInFloat64(exact_first.value, exact.value, exact.value.abs().max().item<double>()));
    for (size_t i = 0; i < full.grads.size(); ++i) {
      ASSERT_EQ(full.grads[i].defined(), first.grads[i].defined()) << i;
      if (!full.grads[i].defined()) continue;
      EXPECT_TRUE(WithinRoundingOf(first.grads[i], full.grads[i], exact.grads[i])) << "parameter " << i;
      // The gradients' own scale is no yardstick where they cancel to zero (the key
      // bias); the output weights' scale, which every gradient term carries, is.
      EXPECT_TRUE(EqualInFloat64(exact_first.grads[i], exact.grads[i],
                                 std::max(exact.grads[i].abs().max().item<double>(), 1.0)))
          << "parameter " << i;
    }
  }
}

TEST(ProjectQkv, EqualsTheThreeProjections) {
  torch::manual_seed(4);
  AdaptableLinear q(16, 16), k(16, 16), v(16, 16);
  torch::Tensor x = torch::randn({3, 7, 16});
  torch::Tensor separate = torch::cat({q(x), k(x), v(x)}, -1);
  // The fused product sums the same terms as the three, in another order: within the
  // products' forward error bound of each other (numeric_bounds.h), on any kernels.
  const torch::Tensor weight = torch::cat({q->weight, k->weight, v->weight}).detach();
  const torch::Tensor bias = torch::cat({q->bias, k->bias, v->bias}).detach();
  FusedQkvWeights fused;
  EXPECT_TRUE(SameProduct(ProjectQkv(q, k, v, x, fused), separate, x, weight.t(), bias));
  SetCpuGemm(CpuGemm::kOneDnn);
  for (auto* linear : {&q, &k, &v}) Freeze(**linear);  // one product on the fused weight's oneDNN reorder
  EXPECT_TRUE(SameProduct(ProjectQkv(q, k, v, x, fused), separate, x, weight.t(), bias));
  SetCpuGemm(CpuGemm::kAuto);
  // Under bf16 autocast: one product on the fused weight cast once, autocast's bits.
  torch::NoGradGuard no_grad;
  AutocastScope autocast(torch::kCPU, Precision::kBf16);
  const torch::Tensor autocasts =
      torch::linear(x, torch::cat({q->weight, k->weight, v->weight}), torch::cat({q->bias, k->bias, v->bias}));
  EXPECT_TRUE(torch::equal(ProjectQkv(q, k, v, x, fused), autocasts));
  EXPECT_TRUE(torch::equal(ProjectQkv(q, k, v, x, fused), autocasts));
  EXPECT_EQ(fused.cast.copies_made(), 1);
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

std::vector<int64_t> Values(const torch::Tensor& t) {
  torch::Tensor longs = t.to(torch::kLong).contiguous();
  return {longs.data_ptr<int64_t>(), longs.data_ptr<int64_t>() + longs.numel()};
}

TEST(PackTokens, ListsTheRealTokensRowByRowThenFillsUpToTheGranule) {
  // Rows of 2, 3 and 1 real tokens out of 4: positions 0 1 | 4 5 6 | 8.
  torch::Tensor mask = torch::tensor({1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0}, torch::kLong).view({3, 4});
  TokenPacking exact = PackTokens(mask, 1);
  EXPECT_EQ(Values(exact.index), (std::vector<int64_t>{0, 1, 4, 5, 6, 8}));
  EXPECT_EQ(Values(exact.starts), (std::vector<int64_t>{0, 2, 5, 6}));
  EXPECT_EQ(exact.starts.scalar_type(), torch::kInt);
  // Granule 5: 6 tokens become 10, the first 4 padding positions (2 3 7 9), cut into
  // ceil(4 / 4) = 1 filler sequence.
  TokenPacking five = PackTokens(mask, 5);
  EXPECT_EQ(Values(five.index), (std::vector<int64_t>{0, 1, 4, 5, 6, 8, 2, 3, 7, 9}));
  EXPECT_EQ(Values(five.starts), (std::vector<int64_t>{0, 2, 5, 6, 10}));
  // Granule 10: 6 become 10 again, but the filler may reach 9 tokens, so 3 filler
  // sequences of at most 4 are always there; the unused ones are empty.
  TokenPacking ten = PackTokens(mask, 10);
  EXPECT_EQ(Values(ten.starts), (std::vector<int64_t>{0, 2, 5, 6, 10, 10, 10}));
  // Granule 8 rounds 6 up to 8; 12 would pass B x S, so 16 is capped there.
  EXPECT_EQ(PackTokens(mask, 8).index.size(0), 8);
  TokenPacking capped = PackTokens(mask, 16);
  EXPECT_EQ(Values(capped.index).size(), 12u);
  EXPECT_EQ(Values(capped.starts), (std::vector<int64_t>{0, 2, 5, 6, 10, 12, 12, 12}));
  EXPECT_EQ(capped.batch, 3);
  EXPECT_EQ(capped.seq, 4);
}

TEST(PackTokens, RefusesWhatIsNotAHostMaskOrAGranule) {
  EXPECT_THROW(PackTokens(torch::ones({4}, torch::kLong), 1), std::invalid_argument);
  EXPECT_THROW(PackTokens(torch::ones({2, 0}, torch::kLong), 1), std::invalid_argument);
  EXPECT_THROW(PackTokens(torch::ones({2, 3}, torch::kLong), 0), std::invalid_argument);
  EXPECT_THROW(PackTokens(torch::Tensor(), 1), std::invalid_argument);
}

TEST(PackTokens, GraphGranuleKeepsTheShapesFewAndTheFillerSmall) {
  EXPECT_EQ(GraphTokenGranule(64, 128), 512);
  EXPECT_EQ(GraphTokenGranule(8, 24), 16);
  EXPECT_EQ(GraphTokenGranule(1, 5), 8);
  auto generator = torch::make_generator<at::CPUGeneratorImpl>(3);
  std::set<int64_t> counts;
  for (int i = 0; i < 200; ++i) {
    torch::Tensor lengths = torch::randint(1, 129, {64}, generator, torch::kLong);
    torch::Tensor mask = torch::arange(128).unsqueeze(0).lt(lengths.unsqueeze(1)).to(torch::kLong);
    TokenPacking packing = PackTokens(mask, GraphTokenGranule(64, 128));
    const int64_t real = lengths.sum().item<int64_t>();
    EXPECT_GE(packing.index.size(0), real);
    EXPECT_LT(packing.index.size(0) - real, 512);
    EXPECT_EQ(packing.starts.size(0), 64 + 1 + 4);  // 511 filler tokens fit in 4 sequences of 128
    counts.insert(packing.index.size(0));
  }
  EXPECT_LE(counts.size(), 16u);
}

TEST(TokenIndex, BuiltFromAHostPackingPacksUnpacksAndReadsFirstRows) {
  torch::Tensor mask = torch::tensor({1, 1, 0, 1, 0, 0}, torch::kLong).view({2, 3});
  torch::Tensor padded = torch::arange(12, torch::kFloat).view({2, 3, 2});
  TokenIndex tokens(PackTokens(mask, 4));  // positions 0 1 3, then the filler 2
  EXPECT_EQ(tokens.tokens(), 4);
  torch::Tensor packed = tokens.Pack(padded);
  EXPECT_TRUE(packed.equal(torch::tensor({0, 1, 2, 3, 6, 7, 4, 5}, torch::kFloat).view({4, 2})));
  // The filler's row comes back too; the padding it does not hold stays zero.
  torch::Tensor expected = padded.clone();
  expected[1][1].zero_();
  expected[1][2].zero_();
  EXPECT_TRUE(tokens.Unpack(packed).equal(expected));
  EXPECT_TRUE(tokens.FirstRows(packed).equal(padded.narrow(1, 0, 1)));
  EXPECT_EQ(Values(tokens.starts()), (std::vector<int64_t>{0, 2, 3, 4}));
  // Built from the mask itself: the same starts, without filler.
  EXPECT_EQ(Values(TokenIndex(mask).starts()), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_TRUE(TokenIndex(mask).FirstRows(TokenIndex(mask).Pack(padded)).equal(padded.narrow(1, 0, 1)));
  EXPECT_THROW(TokenIndex(TokenPacking{}), std::invalid_argument);
}

TEST(TokenIndex, AttentionOnTheCpuIsScattered) {
  torch::Tensor q = torch::randn({5, 2, 8}).to(torch::kBFloat16);
  EXPECT_FALSE(TokenIndex::AttendApplies(q, q, q));
}

}  // namespace
}  // namespace trainyard
