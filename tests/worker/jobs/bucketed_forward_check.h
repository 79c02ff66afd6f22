// Shared by the CPU and GPU tests of BucketedForward: tiny classifiers, right-padded
// batches, and the check that a batch padded up to its bucket gets the logits of its
// own shape (within 1e-5 in fp32; only the order of sums may differ).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "worker/jobs/bucketed_forward.h"
#include "worker/models/model.h"

namespace trainyard::testing {

constexpr int64_t kVocab = 300, kPositions = 64;

inline Model TinyClassifier(ModelFamily family, const torch::Device& device) {
  torch::manual_seed(3);
  PresetArgs args;
  args.vocab_size = kVocab;
  args.max_sequence = kPositions;
  args.labels = {"a", "b", "c"};
  if (family == ModelFamily::kRoberta) {
    args.pad_id = 1;
    args.bos_id = 0;
    args.eos_id = 2;
  }
  nlohmann::json config = PresetConfig(family, ModelTask::kSequenceClassification, "tiny", args);
  Model model = CreateModel(config, ModelTask::kSequenceClassification);
  model->to(device);
  model->eval();
  return model;
}

// Right-padded rows of random lengths 1..seq, the first row full.
inline std::pair<torch::Tensor, torch::Tensor> RandomBatch(int64_t rows, int64_t seq, int64_t pad_id) {
  torch::Tensor lengths = torch::randint(1, seq + 1, {rows}, torch::kLong);
  lengths[0] = seq;
  torch::Tensor mask = torch::arange(seq).unsqueeze(0).lt(lengths.unsqueeze(1)).to(torch::kLong);
  torch::Tensor ids = torch::randint(5, kVocab, {rows, seq}, torch::kLong);
  return {torch::where(mask.to(torch::kBool), ids, torch::full_like(ids, pad_id)), mask};
}

inline const std::vector<std::pair<int64_t, int64_t>> kBuckets = {{1, 16}, {4, 16}, {4, 64}, {8, 32}};

// Batches of every bucket, in an order that alternates buckets, and one no bucket holds.
inline const std::vector<std::pair<int64_t, int64_t>> kBatches = {{1, 5},  {3, 16}, {2, 40}, {1, 16}, {4, 64},
                                                                  {6, 20}, {3, 9},  {8, 32}, {9, 8},  {2, 64}};

inline void ExpectBucketsMatchOwnShape(ModelFamily family, const torch::Device& device, bool cuda_graphs) {
  Model model = TinyClassifier(family, device);
  BucketedForward bucketed(model, kBuckets, Precision::kFp32, cuda_graphs);
  ASSERT_EQ(bucketed.Warm().size(), kBuckets.size());
  for (const auto& [rows, seq] : kBatches) {
    auto [ids, mask] = RandomBatch(rows, seq, model->info().pad_id);
    torch::Tensor expected;
    {
      torch::NoGradGuard no_grad;
      expected = model->forward(ids.to(device), mask.to(device)).to(torch::kCPU);
    }
    torch::Tensor got = bucketed.Forward(ids, mask);
    ASSERT_EQ(got.sizes(), expected.sizes()) << rows << " x " << seq;
    EXPECT_LT((got - expected).abs().max().item<double>(), 1e-5)
        << "family " << int(family) << ": " << rows << " x " << seq << " in bucket " << bucketed.BucketFor(rows, seq);
  }
}

}  // namespace trainyard::testing
