// An ordered, bounded prefetcher: background threads produce items 0..n-1 ahead of
// the consumer, and the consumer receives them strictly in index order.
//
// At most `capacity` items are produced-but-not-consumed at any time (the bound on
// memory). Threads claim the next unclaimed index only while it is inside the window
// [next_to_consume, next_to_consume + capacity). With capacity 0 there are no
// threads: Next() produces the item itself, which is the "prefetch off" baseline.
// An exception thrown by `produce` is rethrown from Next() for that index.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace trainyard {

template <typename T>
class PrefetchQueue {
 public:
  using Producer = std::function<T(size_t index)>;

  // Starts `threads` producer threads (none if capacity is 0). `produce` must be
  // safe to call concurrently for different indices.
  PrefetchQueue(size_t num_items, Producer produce, size_t threads, size_t capacity)
      : num_items_(num_items), produce_(std::move(produce)), capacity_(capacity) {
    if (capacity_ == 0) return;
    for (size_t i = 0; i < std::max<size_t>(1, threads); ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~PrefetchQueue() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : workers_) t.join();
  }

  PrefetchQueue(const PrefetchQueue&) = delete;
  PrefetchQueue& operator=(const PrefetchQueue&) = delete;

  // Blocks until the next item is ready; nullopt after the last one.
  std::optional<T> Next() {
    if (next_to_consume_ >= num_items_) return std::nullopt;
    if (capacity_ == 0) return produce_(next_to_consume_++);
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return ready_.count(next_to_consume_) > 0; });
    Slot slot = std::move(ready_.at(next_to_consume_));
    ready_.erase(next_to_consume_);
    ++next_to_consume_;
    lock.unlock();
    changed_.notify_all();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.item);
  }

 private:
  struct Slot {
    std::optional<T> item;
    std::exception_ptr error;
  };

  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] {
        return stopping_ || next_to_claim_ >= num_items_ || next_to_claim_ < next_to_consume_ + capacity_;
      });
      if (stopping_ || next_to_claim_ >= num_items_) return;
      const size_t index = next_to_claim_++;
      lock.unlock();
      Slot slot;
      try {
        slot.item.emplace(produce_(index));
      } catch (...) {
        slot.error = std::current_exception();
      }
      lock.lock();
      ready_.emplace(index, std::move(slot));
      changed_.notify_all();
    }
  }

  const size_t num_items_;
  Producer produce_;
  const size_t capacity_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<size_t, Slot> ready_;
  size_t next_to_claim_ = 0;
  size_t next_to_consume_ = 0;  // written by the consumer under mutex_ (threaded mode)
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace trainyard
