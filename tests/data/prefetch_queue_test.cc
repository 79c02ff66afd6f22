#include "data/prefetch_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

namespace trainyard {
namespace {

TEST(PrefetchQueue, DeliversInIndexOrderFromManyThreads) {
  PrefetchQueue<size_t> queue(
      200,
      [](size_t i) {
        std::this_thread::sleep_for(std::chrono::microseconds((i * 37) % 500));
        return i;
      },
      4, 8);
  for (size_t expected = 0; expected < 200; ++expected) ASSERT_EQ(*queue.Next(), expected);
  EXPECT_FALSE(queue.Next().has_value());
}

// Polls `done` until it holds or 10 s have passed.
bool Eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(PrefetchQueue, NeverRunsMoreThanCapacityAhead) {
  constexpr size_t kCapacity = 5;
  std::atomic<size_t> produced{0}, consumed{0}, violations{0};
  PrefetchQueue<int> queue(
      100,
      [&](size_t index) {
        if (index >= consumed.load() + kCapacity) ++violations;  // outside the window
        return int(produced++);
      },
      3, kCapacity);
  EXPECT_TRUE(Eventually([&] { return produced.load() == kCapacity; }));
  ++consumed;
  queue.Next();
  EXPECT_TRUE(Eventually([&] { return produced.load() == kCapacity + 1; }));
  while (consumed.load() < 100) {
    ++consumed;  // counted before the call: the window may move as soon as Next() takes an item
    ASSERT_TRUE(queue.Next().has_value());
  }
  EXPECT_EQ(violations.load(), 0u);
  EXPECT_EQ(produced.load(), 100u);
}

TEST(PrefetchQueue, ProducerExceptionSurfacesAtItsIndex) {
  PrefetchQueue<int> queue(
      5,
      [](size_t i) -> int {
        if (i == 2) throw std::runtime_error("bad line");
        return int(i);
      },
      2, 4);
  EXPECT_EQ(*queue.Next(), 0);
  EXPECT_EQ(*queue.Next(), 1);
  EXPECT_THROW(queue.Next(), std::runtime_error);
}

TEST(PrefetchQueue, CapacityZeroProducesOnTheCallersThread) {
  const auto caller = std::this_thread::get_id();
  PrefetchQueue<bool> queue(
      3, [&](size_t) { return std::this_thread::get_id() == caller; }, 2, 0);
  EXPECT_TRUE(*queue.Next());
}

}  // namespace
}  // namespace trainyard
