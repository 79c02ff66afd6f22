// Large CPU tensor buffers kept for reuse, instead of going back to glibc after each use.
//
// Why: a forward pass allocates and frees buffers of megabytes (a batch's activations).
// glibc either maps such a buffer afresh each time (past its mmap threshold) or carves
// it from the heap, where frees of ever-different sizes (an unpadded batch has a new
// token count each time) leave holes that stay resident, so a server's memory creeps.
// Giving the free heap back (malloc_trim) stops the creep, but then the next batch
// faults every page in again: in the model process of `kind: serve` that was a fifth of
// its time, in the kernel, zeroing pages.
//
// The cache takes every CPU allocation of kMinBytes or more. A block is mapped from the
// kernel on its own (never from glibc's heap, so it cannot pin or fragment it), in one
// of a few sizes (2^(k/4) bytes), and on release it is kept: a later request takes the
// smallest kept block of its own size class or the next one up (so at most 41% larger),
// and batches of nearby token counts share blocks. Kept blocks are bounded by the cap
// and by twice the most ever in use at once (a batch's or a step's working set, which
// the next one asks for again, in sizes of its own): past that, the ones released
// longest ago are unmapped. Smaller allocations go to the allocator it replaced.
//
// Installed once per process (runtime.cpu_block_cache_mb; PrepareRuntime) before any
// model is built; the instance lives until the process ends, since tensors may be
// freed during static destruction. Thread-safe.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

namespace trainyard {

class CpuBlockCache final : public c10::Allocator {
 public:
  static constexpr size_t kMinBytes = size_t(256) << 10;

  struct Stats {
    int64_t reused = 0;       // allocations served by a kept block
    int64_t mapped = 0;       // allocations that mapped a new block
    size_t kept_bytes = 0;    // free blocks held now
    size_t in_use_bytes = 0;  // blocks lent out now
    size_t peak_in_use_bytes = 0;
  };

  // Makes the process's CPU allocator a cache keeping at most `cap_bytes` of free
  // blocks, and returns it. Later calls only change the cap (0 keeps nothing: every
  // block is unmapped when freed, which still keeps large buffers out of the heap).
  static CpuBlockCache& Install(size_t cap_bytes);
  // The installed cache, or null.
  static CpuBlockCache* Installed();

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }
  void copy_data(void* dest, const void* src, size_t count) const override;

  Stats stats() const;
  // Unmaps every kept block (the blocks in use stay).
  void Drop();

 private:
  explicit CpuBlockCache(c10::Allocator* fallback) : fallback_(fallback) {}
  static void Release(void* data);
  void Keep(void* data);
  void* Take(size_t bytes);
  void TrimTo(size_t cap);  // REQUIRES: mutex_ held

  c10::Allocator* const fallback_;  // the allocator replaced, for small blocks
  mutable std::mutex mutex_;
  size_t cap_ = 0;
  std::unordered_map<void*, size_t> in_use_;  // block -> its mapped size
  // Kept blocks, oldest release first; by_size_ indexes them by their mapped size.
  struct Kept {
    void* data;
    size_t bytes;
  };
  std::list<Kept> kept_;
  std::multimap<size_t, std::list<Kept>::iterator> by_size_;
  Stats stats_;
};

}  // namespace trainyard
