#include "data/prefetch_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace trainyard {
namespace {

TEST(PrefetchQueue, DeliversInIndexOrderFromManyThreads) {
  PrefetchQueue<size_t> queue(
      200, [](size_t i) {
        std::this_thread::sleep_for(std::chrono::microseconds((i * 37) % 500));
        return i;
      },
      4, 8);
  for (size_t expected = 0; expected < 200; ++expected) ASSERT_EQ(*queue.Next(), expected);
  EXPECT_FALSE(queue.Next().has_value());
}

TEST(PrefetchQueue, NeverRunsMoreThanCapacityAhead) {
  std::atomic<size_t> produced{0};
  PrefetchQueue<int> queue(100, [&](size_t) { return int(produced++); }, 3, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(produced.load(), 5u);
  queue.Next();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(produced.load(), 6u);
}

TEST(PrefetchQueue, ProducerExceptionSurfacesAtItsIndex) {
  PrefetchQueue<int> queue(5, [](size_t i) -> int {
        if (i == 2) throw std::runtime_error("bad line");
        return int(i);
      }, 2, 4);
  EXPECT_EQ(*queue.Next(), 0);
  EXPECT_EQ(*queue.Next(), 1);
  EXPECT_THROW(queue.Next(), std::runtime_error);
}

TEST(PrefetchQueue, CapacityZeroProducesOnTheCallersThread) {
  const auto caller = std::this_thread::get_id();
  PrefetchQueue<bool> queue(3, [&](size_t) { return std::this_thread::get_id() == caller; }, 2, 0);
  EXPECT_TRUE(*queue.Next());
}

}  // namespace
}  // namespace trainyard
