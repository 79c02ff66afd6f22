// The KV cache's two ways of being written (kv_cache.h): decode steps at a write slot,
// attending over the whole preallocated cache with the unwritten positions masked (the
// fixed shapes a CUDA graph captures), give the logits of the growing steps, for
// left-padded rows, within 1e-5 in fp32.
#include "worker/models/kv_cache.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/models/model.h"

namespace trainyard {
namespace {

constexpr int64_t kVocab = 200, kPrompt = 7, kSteps = 6, kCapacity = kPrompt + kSteps + 3;

TEST(KvCache, WriteSlotStepsGiveTheGrowingStepsLogits) {
  torch::manual_seed(5);
  PresetArgs args;
  args.vocab_size = kVocab;
  args.max_sequence = 32;
  auto model = std::dynamic_pointer_cast<CausalLmImpl>(
      CreateModel(PresetConfig(ModelFamily::kGpt2, ModelTask::kCausalLm, "tiny", args), ModelTask::kCausalLm));
  ASSERT_TRUE(model);
  model->eval();
  torch::NoGradGuard no_grad;
  // Three left-padded prompts of 7, 4 and 2 tokens, positions counting real tokens.
  torch::Tensor keep = torch::ones({3, kPrompt}, torch::kBool);
  keep[1].narrow(0, 0, 3).fill_(false);
  keep[2].narrow(0, 0, 5).fill_(false);
  torch::Tensor ids = torch::randint(1, kVocab, {3, kPrompt}, torch::kLong).masked_fill(keep.logical_not(), 0);
  torch::Tensor positions = (keep.to(torch::kLong).cumsum(1) - 1).clamp_min(0);

  KvCache growing = model->NewCache(3, kCapacity, torch::kFloat), fixed = model->NewCache(3, kCapacity, torch::kFloat);
  torch::Tensor prefill = model->Step(ids, positions, keep, growing, true);
  EXPECT_TRUE(model->Step(ids, positions, keep, fixed, true).equal(prefill));

  torch::Tensor slot = torch::full({1}, kPrompt, torch::kLong);
  fixed.UseWriteSlot(slot);
  torch::Tensor keep_all = torch::zeros({3, kCapacity}, torch::kBool);
  keep_all.narrow(1, 0, kPrompt).copy_(keep);
  torch::Tensor next = positions.narrow(1, kPrompt - 1, 1);
  torch::Tensor grown_keep = keep;
  for (int64_t step = 0; step < kSteps; ++step) {
    torch::Tensor tokens = torch::randint(1, kVocab, {3, 1}, torch::kLong);
    next = next + 1;
    grown_keep = torch::cat({grown_keep, torch::ones({3, 1}, torch::kBool)}, 1);
    torch::Tensor expected = model->Step(tokens, next, grown_keep, growing, true);
    keep_all.index_fill_(1, slot, true);
    torch::Tensor got = model->Step(tokens, next, keep_all, fixed, true);
    slot.add_(1);
    ASSERT_EQ(got.sizes(), expected.sizes());
    EXPECT_LT((got - expected).abs().max().item<double>(), 1e-5) << "decode step " << step;
  }
  EXPECT_EQ(fixed.length(), kPrompt);  // a write slot leaves the length where the prefill put it
  EXPECT_THROW(model->Step(ids, positions, keep_all, fixed, true), std::exception);  // one position a step
}

}  // namespace
}  // namespace trainyard
