#include "worker/kernels/cpu_block_cache.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace trainyard {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

// Installed for the rest of models_test's process, as a job's PrepareRuntime does: the
// other suites then run their tensors through it too.
class CpuBlockCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = &CpuBlockCache::Install(512 * kMiB);
    cache_->Drop();
  }
  void TearDown() override { CpuBlockCache::Install(512 * kMiB); }

  // A float tensor of `bytes` bytes from the CPU allocator.
  static torch::Tensor Floats(size_t bytes) { return torch::empty({int64_t(bytes / sizeof(float))}); }

  CpuBlockCache* cache_ = nullptr;
};

TEST_F(CpuBlockCacheTest, IsTheCpuAllocatorOnceInstalled) {
  EXPECT_EQ(c10::GetCPUAllocator(), cache_);
  EXPECT_EQ(CpuBlockCache::Installed(), cache_);
  EXPECT_EQ(&CpuBlockCache::Install(64 * kMiB), cache_);  // a second call changes only the cap
}

TEST_F(CpuBlockCacheTest, AFreedLargeBlockServesTheNextRequestOfANearbySize) {
  const auto before = cache_->stats();
  void* first = nullptr;
  {
    torch::Tensor a = Floats(4 * kMiB);
    first = a.data_ptr();
    a.fill_(1);
    EXPECT_EQ(cache_->stats().mapped, before.mapped + 1);
  }
  EXPECT_GE(cache_->stats().kept_bytes, 4 * kMiB);
  torch::Tensor b = Floats(4 * kMiB - 100 * 1024);  // a batch a few tokens shorter
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(cache_->stats().reused, before.reused + 1);
  EXPECT_EQ(cache_->stats().kept_bytes, 0u);
}

TEST_F(CpuBlockCacheTest, AMuchSmallerRequestDoesNotTakeALargeBlock) {
  void* large = nullptr;
  {
    torch::Tensor a = Floats(8 * kMiB);
    large = a.data_ptr();
  }
  torch::Tensor b = Floats(2 * kMiB);  // two octaves down: it would waste three quarters
  EXPECT_NE(b.data_ptr(), large);
  torch::Tensor c = Floats(16 * kMiB);  // larger than any kept block
  EXPECT_NE(c.data_ptr(), large);
  EXPECT_GE(cache_->stats().kept_bytes, 8 * kMiB);
}

TEST_F(CpuBlockCacheTest, SmallBlocksGoToTheReplacedAllocator) {
  const auto before = cache_->stats();
  {
    torch::Tensor small = Floats(CpuBlockCache::kMinBytes - 64);
    small.fill_(2);
    EXPECT_EQ(small.sum().item<float>(), 2.0f * float(small.numel()));
  }
  const auto after = cache_->stats();
  EXPECT_EQ(after.mapped, before.mapped);
  EXPECT_EQ(after.reused, before.reused);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
}

// oneDNN's scratchpads come through raw_allocate/raw_deallocate (ideep's allocator).
TEST_F(CpuBlockCacheTest, RawAllocateAndDeallocateWorkForBothSizes) {
  ASSERT_NE(cache_->raw_deleter(), nullptr);
  const size_t in_use = cache_->stats().in_use_bytes;
  for (size_t bytes : {size_t(100), CpuBlockCache::kMinBytes, 3 * kMiB}) {
    void* p = cache_->raw_allocate(bytes);
    ASSERT_NE(p, nullptr);
    std::memset(p, 7, bytes);
    cache_->raw_deallocate(p);
  }
  EXPECT_EQ(cache_->stats().in_use_bytes, in_use);
}

TEST_F(CpuBlockCacheTest, KeptBlocksStayWithinTheCap) {
  CpuBlockCache::Install(1 * kMiB);
  {
    std::vector<torch::Tensor> held;
    for (int i = 0; i < 6; ++i) held.push_back(Floats(512 * 1024));
  }
  EXPECT_LE(cache_->stats().kept_bytes, 1 * kMiB);
  CpuBlockCache::Install(0);
  EXPECT_EQ(cache_->stats().kept_bytes, 0u);
  { torch::Tensor unkept = Floats(2 * kMiB); }
  EXPECT_EQ(cache_->stats().kept_bytes, 0u);
}

// Under an address-space cap (the benchmark's memory_cap_mb), kept blocks make way for a
// new one, and what still does not fit is an out-of-memory error, as libtorch's own.
TEST_F(CpuBlockCacheTest, KeptBlocksMakeWayAndTheRestIsOutOfMemory) {
  { torch::Tensor kept = Floats(48 * kMiB); }
  ASSERT_GE(cache_->stats().kept_bytes, 48 * kMiB);
  rlimit previous{};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &previous), 0);
  size_t vm_kb = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoul(line.substr(7));
  rlimit cap = previous;
  cap.rlim_cur = rlim_t(vm_kb * 1024 + 16 * kMiB);
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &cap), 0);
  bool fitted = false, out_of_memory = false;
  try {
    torch::Tensor other = Floats(24 * kMiB);  // two classes below the kept block: not reused
    fitted = true;
    torch::Tensor too_big = Floats(256 * kMiB);
  } catch (const c10::OutOfMemoryError& e) {
    out_of_memory = std::string(e.what()).find("out of memory") != std::string::npos;
  }
  ::setrlimit(RLIMIT_AS, &previous);
  EXPECT_TRUE(fitted);
  EXPECT_TRUE(out_of_memory);
  const size_t kept = cache_->stats().kept_bytes;  // the 24 MiB block, not the 48 MiB one
  EXPECT_GE(kept, 24 * kMiB);
  EXPECT_LT(kept, 48 * kMiB);
}

TEST_F(CpuBlockCacheTest, OperatorsComputeTheSameOnReusedBlocks) {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({300, 512}), w = torch::randn({1024, 512});
  const torch::Tensor first = torch::gelu(torch::linear(x, w)).clone();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(torch::gelu(torch::linear(x, w)), first));
  EXPECT_GT(cache_->stats().reused, 0);
}

TEST_F(CpuBlockCacheTest, ThreadsShareTheCache) {
  const size_t in_use = cache_->stats().in_use_bytes;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 50; ++i) {
        torch::Tensor a = torch::full({int64_t((300 + 37 * ((t + i) % 7)) * 1024)}, float(t));
        ASSERT_EQ(a.min().item<float>(), float(t));
      }
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(cache_->stats().in_use_bytes, in_use);
}

}  // namespace
}  // namespace trainyard
