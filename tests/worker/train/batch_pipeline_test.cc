// The input pipeline overlaps I/O with compute: with a reader slowed to X ms per batch
// and Y > X ms of compute per step, a step takes ~Y with prefetch and X + Y without.
#include "worker/train/batch_pipeline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "data/wordpiece_tokenizer.h"

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kReadMs = 30, kComputeMs = 60, kBatches = 24;

class BatchPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vocab_ = std::filesystem::temp_directory_path() / ("ty_bp_vocab_" + std::to_string(::getpid()));
    std::ofstream(vocab_) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\ncat\nsat\n";
    for (int i = 0; i < 200; ++i)
      data_.examples.push_back({std::string(i % 7 + 1, 'x') == "x" ? "the cat" : "the cat sat the cat sat", i % 3});
  }
  void TearDown() override { std::filesystem::remove(vocab_); }

  struct Timing {
    double steady_step_ms, wait_pct;
  };

  Timing RunEpoch(size_t prefetch) {
    WordPieceTokenizer tokenizer(vocab_.string(), true);
    std::vector<BatchIndices> plan = SequentialBatches(data_.examples.size(), 8);
    plan.resize(kBatches);
    PipelineOptions options;
    options.prefetch_batches = prefetch;
    options.threads = 1;
    options.before_collate = [](size_t) { std::this_thread::sleep_for(std::chrono::milliseconds(kReadMs)); };
    BatchPipeline pipeline(data_, tokenizer, plan, options);
    double wait_ms = 0, total_ms = 0;
    Clock::time_point steady_start;
    for (int step = 0; step < kBatches; ++step) {
      if (step == 3) {  // skip the pipeline's fill
        steady_start = Clock::now();
        wait_ms = 0;
      }
      auto before = Clock::now();
      EXPECT_TRUE(pipeline.Next().has_value());
      wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - before).count();
      std::this_thread::sleep_for(std::chrono::milliseconds(kComputeMs));  // the "training step"
    }
    total_ms = std::chrono::duration<double, std::milli>(Clock::now() - steady_start).count();
    return {total_ms / (kBatches - 3), 100.0 * wait_ms / total_ms};
  }

  std::filesystem::path vocab_;
  TextDataset data_;
};

TEST_F(BatchPipelineTest, CollatePadsToTheLongestAndMasks) {
  WordPieceTokenizer tokenizer(vocab_.string(), true);
  Batch batch = CollateBatch(data_, tokenizer, {0, 1}, 64, false);
  ASSERT_EQ(batch.input_ids.sizes(), torch::IntArrayRef({2, 8}));
  EXPECT_EQ(batch.attention_mask.sum().item<int64_t>(), 4 + 8);
  EXPECT_EQ(batch.input_ids[0][5].item<int64_t>(), 0);  // [PAD]
  EXPECT_EQ(batch.real_tokens, 12);
}

TEST_F(BatchPipelineTest, CollatePadsUpToTheFirstBucketLengthThatHoldsTheBatch) {
  WordPieceTokenizer tokenizer(vocab_.string(), true);
  const Batch longest = CollateBatch(data_, tokenizer, {0, 1}, 64, false);
  const Batch bucketed = CollateBatch(data_, tokenizer, {0, 1}, 64, false, nullptr, {4, 16, 32});
  ASSERT_EQ(bucketed.input_ids.sizes(), torch::IntArrayRef({2, 16}));  // 8 tokens: the 16 bucket
  EXPECT_TRUE(bucketed.input_ids.narrow(1, 0, 8).equal(longest.input_ids));
  EXPECT_EQ(bucketed.attention_mask.sum().item<int64_t>(), longest.attention_mask.sum().item<int64_t>());
  EXPECT_EQ(bucketed.input_ids.narrow(1, 8, 8).ne(0).sum().item<int64_t>(), 0);  // [PAD] after
  EXPECT_EQ(bucketed.real_tokens, longest.real_tokens);
}

TEST_F(BatchPipelineTest, HostPackingFollowsThePolicyAndTheGraphGranule) {
  WordPieceTokenizer tokenizer(vocab_.string(), true);
  auto packed = [&](HostPacking how, const std::vector<int>& buckets) {
    Batch batch = CollateBatch(data_, tokenizer, {0, 1}, 64, false, nullptr, buckets);  // 4 and 8 real tokens
    PackOnHost(how, &batch);
    return batch;
  };
  EXPECT_FALSE(packed({Unpadding::kNever, false}, {}).packing.defined());
  // Padded to 8, 4 of 16 are padding: auto packs at a tenth or more.
  const Batch exact = packed({Unpadding::kAuto, false}, {});
  ASSERT_TRUE(exact.packing.defined());
  EXPECT_EQ(exact.packing.index.size(0), 12);
  EXPECT_TRUE(exact.packing.starts.equal(torch::tensor({0, 4, 12}, torch::kInt)));
  // For graphs, 12 real tokens of 2 x 32 round up to the granule, 8.
  const Batch graphed = packed({Unpadding::kAlways, true}, {32});
  EXPECT_EQ(graphed.packing.index.size(0), 16);
  EXPECT_EQ(graphed.packing.starts.size(0), 2 + 1 + 1);
  // A batch without enough padding is left alone under auto.
  Batch full = CollateBatch(data_, tokenizer, {1, 1}, 64, false);
  PackOnHost({Unpadding::kAuto, false}, &full);
  EXPECT_FALSE(full.packing.defined());
}

TEST(PadBucketLengths, EvenlySpacedMultiplesOfEightEndingAtTheMaximum) {
  EXPECT_EQ(PadBucketLengths(0, 128), std::vector<int>{});
  EXPECT_EQ(PadBucketLengths(4, 128), (std::vector<int>{32, 64, 96, 128}));
  EXPECT_EQ(PadBucketLengths(4, 100), (std::vector<int>{32, 56, 80, 100}));
  EXPECT_EQ(PadBucketLengths(3, 64), (std::vector<int>{24, 48, 64}));
  EXPECT_EQ(PadBucketLengths(64, 8), std::vector<int>{8});  // more buckets than multiples of 8
}

// A tokenizer that counts its calls, to see what the cache saves.
class CountingTokenizer : public WordPieceTokenizer {
 public:
  using WordPieceTokenizer::WordPieceTokenizer;
  std::vector<int32_t> Encode(std::string_view text, int max_len) const override {
    ++calls;
    return WordPieceTokenizer::Encode(text, max_len);
  }
  mutable std::atomic<int> calls{0};
};

TEST_F(BatchPipelineTest, TokenCacheEncodesEachExampleOnceAndGivesTheSameBatches) {
  CountingTokenizer tokenizer(vocab_.string(), true);
  TokenCache cache(data_, tokenizer, 6, size_t(1) << 20);
  const std::vector<BatchIndices> plan = SequentialBatches(data_.examples.size(), 8);
  for (int epoch = 0; epoch < 3; ++epoch) {
    PipelineOptions options;
    options.threads = 2;
    options.max_len = 6;
    options.cache = &cache;
    BatchPipeline cached(data_, tokenizer, plan, options);
    for (const BatchIndices& indices : plan) {
      std::optional<Batch> batch = cached.Next();
      ASSERT_TRUE(batch.has_value());
      Batch plain = CollateBatch(data_, tokenizer, indices, 6, false);
      EXPECT_TRUE(batch->input_ids.equal(plain.input_ids));
      EXPECT_TRUE(batch->attention_mask.equal(plain.attention_mask));
      EXPECT_EQ(batch->real_tokens, plain.real_tokens);
    }
  }
  // 200 encodings by the cache (once each) and 3 x 200 by the uncached comparisons.
  EXPECT_EQ(tokenizer.calls.load(), 200 + 3 * 200);
  EXPECT_GT(cache.cached_bytes(), 0u);
}

TEST_F(BatchPipelineTest, TokenCacheOverBudgetStillEncodesCorrectly) {
  CountingTokenizer tokenizer(vocab_.string(), true);
  TokenCache cache(data_, tokenizer, 64, /*budget_bytes=*/200);  // room for a few examples only
  for (int round = 0; round < 2; ++round)
    for (int32_t i = 0; i < 20; ++i)
      EXPECT_EQ(cache.Ids(i), tokenizer.WordPieceTokenizer::Encode(data_.examples[i].text, 64));
  EXPECT_LE(cache.cached_bytes(), 200u);
  EXPECT_GT(tokenizer.calls.load(), 20);  // the examples beyond the budget were encoded again
}

TEST_F(BatchPipelineTest, PrefetchHidesTheReaderBehindCompute) {
  Timing with = RunEpoch(4);
  std::printf("prefetch on:  %.1f ms/step, data wait %.1f%% (compute %d ms, read %d ms)\n", with.steady_step_ms,
              with.wait_pct, kComputeMs, kReadMs);
  EXPECT_LT(with.steady_step_ms, kComputeMs * 1.15);
  EXPECT_LT(with.wait_pct, 5.0);
}

TEST_F(BatchPipelineTest, WithoutPrefetchReadAndComputeAdd) {
  Timing without = RunEpoch(0);
  std::printf("prefetch off: %.1f ms/step, data wait %.1f%%\n", without.steady_step_ms, without.wait_pct);
  EXPECT_GT(without.steady_step_ms, (kReadMs + kComputeMs) * 0.95);
  EXPECT_LT(without.steady_step_ms, (kReadMs + kComputeMs) * 1.15);
}

}  // namespace
}  // namespace trainyard
