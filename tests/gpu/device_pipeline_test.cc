// The input pipeline and step timing on a GPU: pinned host batches copied on a side
// stream keep a slowed reader off the critical path, and StepTimer reads device time
// without making the host wait inside a step. Skipped where no CUDA device is visible.
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/clock.h"
#include "data/wordpiece_tokenizer.h"
#include "worker/train/batch_pipeline.h"
#include "worker/train/device_transfer.h"
#include "worker/train/step_timer.h"

namespace trainyard {
namespace {

class DevicePipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device is visible";
    vocab_ = std::filesystem::temp_directory_path() / ("ty_gpu_vocab_" + std::to_string(::getpid()));
    std::ofstream(vocab_) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\ncat\nsat\n";
    for (int i = 0; i < 400; ++i) data_.examples.push_back({i % 2 ? "the cat" : "the cat sat the cat sat", i % 3});
    cycles_per_ms_ = CalibrateSleep();
  }
  void TearDown() override {
    if (!vocab_.empty()) std::filesystem::remove(vocab_);
  }

  // GPU clock cycles that at::cuda::sleep spins per millisecond on this device.
  static double CalibrateSleep() {
    const int64_t cycles = 10'000'000;
    at::cuda::sleep(cycles);  // warm-up
    c10::cuda::getCurrentCUDAStream().synchronize();
    auto start = Clock::now();
    at::cuda::sleep(cycles);
    c10::cuda::getCurrentCUDAStream().synchronize();
    return double(cycles) / MsSince(start);
  }
  void SpinDevice(double ms) const { at::cuda::sleep(static_cast<int64_t>(ms * cycles_per_ms_)); }

  std::filesystem::path vocab_;
  TextDataset data_;
  double cycles_per_ms_ = 0;
};

TEST_F(DevicePipelineTest, PinnedSideStreamCopiesKeepTheDataWaitUnderTwoPercent) {
  static constexpr int kReadMs = 15, kComputeMs = 40, kBatches = 30, kWarmup = 4;
  WordPieceTokenizer tokenizer(vocab_.string(), true);
  std::vector<BatchIndices> plan = SequentialBatches(data_.examples.size(), 8);
  plan.resize(kBatches);
  PipelineOptions options;
  options.prefetch_batches = 4;
  options.threads = 1;
  options.pin_memory = true;
  options.before_collate = [](size_t) { std::this_thread::sleep_for(std::chrono::milliseconds(kReadMs)); };
  BatchPipeline pipeline(data_, tokenizer, plan, options);
  DeviceTransfer transfer(torch::Device(torch::kCUDA, 0));
  double wait_ms = 0;
  Clock::time_point steady_start;
  for (int step = 0; step < kBatches; ++step) {
    if (step == kWarmup) {
      steady_start = Clock::now();
      wait_ms = 0;
    }
    auto before = Clock::now();
    std::optional<Batch> host = pipeline.Next();
    wait_ms += MsSince(before);
    ASSERT_TRUE(host.has_value());
    ASSERT_TRUE(host->input_ids.is_pinned());
    torch::Tensor expected = host->input_ids.clone();
    Batch batch = transfer.ToDevice(std::move(*host));
    SpinDevice(kComputeMs);  // the "training step", queued behind the copy on the compute stream
    ASSERT_TRUE(batch.input_ids.cpu().equal(expected));  // also ends the step, as a logging read would
  }
  const double total_ms = MsSince(steady_start);
  const double wait_pct = 100.0 * wait_ms / total_ms;
  std::printf("reader %d ms/batch, device compute %d ms/step: %.1f ms/step, data wait %.2f%%\n", kReadMs, kComputeMs,
              total_ms / (kBatches - kWarmup), wait_pct);
  EXPECT_LT(wait_pct, 2.0);
}

TEST_F(DevicePipelineTest, StepTimerReadsDeviceTimeWithoutWaiting) {
  StepTimer timer(torch::Device(torch::kCUDA, 0), 2);
  auto host_start = Clock::now();
  for (int step = 0; step < 3; ++step) {
    timer.Begin();
    SpinDevice(20);
    timer.Mark();
    SpinDevice(10);
    timer.Mark();
  }
  const double host_ms = MsSince(host_start);
  std::vector<std::vector<double>> parts = timer.Collect();
  ASSERT_EQ(parts.size(), 3u);
  for (const auto& step : parts) {
    std::printf("device parts: %.2f ms, %.2f ms\n", step[0], step[1]);
    EXPECT_NEAR(step[0], 20.0, 4.0);
    EXPECT_NEAR(step[1], 10.0, 2.0);
  }
  std::printf("host time to queue 3 steps of 30 ms: %.2f ms\n", host_ms);
  EXPECT_LT(host_ms, 15.0);  // the marks did not wait for the device
  EXPECT_TRUE(timer.Collect().empty());
}

}  // namespace
}  // namespace trainyard
