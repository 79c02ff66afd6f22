#include "worker/kernels/cpu_block_cache.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

namespace trainyard {
namespace {

std::atomic<CpuBlockCache*> g_installed{nullptr};

size_t PageRounded(size_t bytes) {
  static const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// Blocks are mapped in sizes 2^(k/4), page-rounded: at most 19% above the request, and
// few enough distinct sizes that batches of nearby token counts ask for the same ones.
size_t SizeClass(size_t bytes) {
  constexpr double kClassesPerOctave = 4;
  const double rounded = std::exp2(std::ceil(std::log2(double(bytes)) * kClassesPerOctave) / kClassesPerOctave);
  return PageRounded(std::max(bytes, size_t(rounded)));
}

// The largest kept block a request of `bytes` may take: one class above its own.
size_t LargestToReuse(size_t bytes) { return SizeClass(SizeClass(bytes) + 1); }

// Kept blocks stay within this many times the most ever in use at once.
constexpr size_t kKeptPerPeak = 2;

}  // namespace

CpuBlockCache& CpuBlockCache::Install(size_t cap_bytes) {
  static std::mutex install_mutex;
  std::lock_guard<std::mutex> lock(install_mutex);
  CpuBlockCache* cache = g_installed.load();
  if (!cache) {
    cache = new CpuBlockCache(c10::GetCPUAllocator());  // never deleted: see the header
    c10::SetCPUAllocator(cache, /*priority=*/1);
    g_installed = cache;
  }
  std::lock_guard<std::mutex> cache_lock(cache->mutex_);
  cache->cap_ = cap_bytes;
  cache->TrimTo(cap_bytes);
  return *cache;
}

CpuBlockCache* CpuBlockCache::Installed() { return g_installed.load(); }

c10::DataPtr CpuBlockCache::allocate(size_t bytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (bytes < kMinBytes) {
    // The replaced allocator's block, under our deleter (raw_deleter() promises one
    // deleter for every block); Release hands it back.
    c10::DataPtr small = fallback_->allocate(bytes);
    void* data = small.get();
    if (small.get_context() != data)
      TORCH_CHECK(false, "CpuBlockCache: the replaced CPU allocator's blocks carry a context");
    small.release_context();
    return {data, data, &Release, cpu};
  }
  void* data = Take(bytes);
  if (!data) {
    const size_t mapped = SizeClass(bytes);
    data = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {  // kept blocks may be what stands in the way (an address-space cap)
      Drop();
      data = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (data == MAP_FAILED)
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CpuBlockCache: out of memory: cannot map ", mapped,
                       " bytes: ", std::strerror(errno));
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_.emplace(data, mapped);
    stats_.in_use_bytes += mapped;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    ++stats_.mapped;
  }
  return {data, data, &Release, cpu};
}

void* CpuBlockCache::Take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_size_.lower_bound(bytes);
  if (it == by_size_.end() || it->first > LargestToReuse(bytes)) return nullptr;
  const Kept block = *it->second;
  kept_.erase(it->second);
  by_size_.erase(it);
  in_use_.emplace(block.data, block.bytes);
  stats_.kept_bytes -= block.bytes;
  stats_.in_use_bytes += block.bytes;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  ++stats_.reused;
  return block.data;
}

void CpuBlockCache::Release(void* data) {
  if (!data) return;
  CpuBlockCache* cache = g_installed.load();
  cache->Keep(data);
}

void CpuBlockCache::Keep(void* data) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = in_use_.find(data);
  if (it == in_use_.end()) {
    lock.unlock();
    fallback_->raw_deleter()(data);  // a small block
    return;
  }
  const size_t bytes = it->second;
  in_use_.erase(it);
  stats_.in_use_bytes -= bytes;
  if (bytes > cap_) {
    lock.unlock();
    ::munmap(data, bytes);
    return;
  }
  kept_.push_back({data, bytes});
  by_size_.emplace(bytes, std::prev(kept_.end()));
  stats_.kept_bytes += bytes;
  TrimTo(std::min(cap_, kKeptPerPeak * stats_.peak_in_use_bytes));
}

void CpuBlockCache::TrimTo(size_t cap) {
  while (stats_.kept_bytes > cap) {
    const Kept oldest = kept_.front();
    auto range = by_size_.equal_range(oldest.bytes);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second == kept_.begin()) {
        by_size_.erase(it);
        break;
      }
    kept_.pop_front();
    stats_.kept_bytes -= oldest.bytes;
    ::munmap(oldest.data, oldest.bytes);
  }
}

void CpuBlockCache::Drop() {
  std::lock_guard<std::mutex> lock(mutex_);
  TrimTo(0);
}

CpuBlockCache::Stats CpuBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CpuBlockCache::copy_data(void* dest, const void* src, size_t count) const { default_copy_data(dest, src, count); }

}  // namespace trainyard
