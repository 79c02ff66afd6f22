// The batching rule (worker/serve/batcher.h) driven with explicit times: length-aware
// grouping, the row and token caps, preferred sizes, the queue delay, priorities, the
// queue bound, cancelled or expired requests, and the bounded sweep for gone clients.
#include "worker/serve/batcher.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace trainyard {
namespace {

using std::chrono::milliseconds;

std::shared_ptr<const VersionMeta> Meta(const std::string& model = "m") {
  auto meta = std::make_shared<VersionMeta>();
  meta->model = model;
  meta->version = 1;
  meta->max_tokens = 512;
  return meta;
}

RequestPtr Request(const std::shared_ptr<const VersionMeta>& meta, int length, int rows = 1, int priority = 10,
                   milliseconds timeout = milliseconds(60000)) {
  return std::make_shared<InferRequest>(meta, std::vector<std::vector<int32_t>>(rows, std::vector<int32_t>(length, 1)),
                                        priority, ServeClock::now() + timeout);
}

std::vector<int> Lengths(const Batch& batch) {
  std::vector<int> out;
  for (const auto& r : batch.requests) out.push_back(r->longest());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Batcher, GroupsRequestsOfSimilarLength) {
  Batcher batcher({4, 100000, {}, 0, 100, true});
  auto meta = Meta();
  for (int length : {10, 200, 12, 190, 11, 205, 9, 195}) ASSERT_TRUE(batcher.Push(Request(meta, length)));
  auto first = batcher.Next(ServeClock::now() + milliseconds(1), nullptr);
  ASSERT_TRUE(first);
  EXPECT_EQ(Lengths(*first), (std::vector<int>{9, 10, 11, 12}));
  EXPECT_EQ(first->seq, 12);
  EXPECT_EQ(first->padded_tokens(), 48);
  auto second = batcher.Next(ServeClock::now() + milliseconds(1), nullptr);
  ASSERT_TRUE(second);
  EXPECT_EQ(Lengths(*second), (std::vector<int>{190, 195, 200, 205}));
  EXPECT_EQ(batcher.size(), 0u);
}

TEST(Batcher, ArrivalOrderWhenLengthAwareIsOff) {
  Batcher batcher({4, 100000, {}, 0, 100, false});
  auto meta = Meta();
  for (int length : {10, 200, 12, 190, 11}) batcher.Push(Request(meta, length));
  auto batch = batcher.Next(ServeClock::now() + milliseconds(1), nullptr);
  ASSERT_TRUE(batch);
  EXPECT_EQ(Lengths(*batch), (std::vector<int>{10, 12, 190, 200}));
  EXPECT_EQ(batch->seq, 200);
}

TEST(Batcher, TokenBudgetCapsTheBatch) {
  Batcher batcher({32, 400, {}, 1000, 100, true});  // rows x longest <= 400
  auto meta = Meta();
  for (int i = 0; i < 6; ++i) batcher.Push(Request(meta, 100));
  ServeClock::time_point wake;
  auto batch = batcher.Next(ServeClock::now(), &wake);  // full by tokens: goes before the delay
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->rows, 4);
  EXPECT_LE(batch->padded_tokens(), 400);
}

TEST(Batcher, WaitsForTheDelayUnlessFullOrPreferred) {
  Batcher batcher({8, 100000, {3}, 50, 100, true});
  auto meta = Meta();
  batcher.Push(Request(meta, 10));
  batcher.Push(Request(meta, 10));
  ServeClock::time_point wake{};
  const auto now = ServeClock::now();
  EXPECT_FALSE(batcher.Next(now, &wake));
  EXPECT_GT(wake, now);
  EXPECT_LE(wake, now + milliseconds(51));
  batcher.Push(Request(meta, 10));  // 3 rows: a preferred size
  auto batch = batcher.Next(ServeClock::now(), &wake);
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->rows, 3);
  batcher.Push(Request(meta, 10));
  EXPECT_FALSE(batcher.Next(ServeClock::now(), &wake));
  EXPECT_TRUE(batcher.Next(ServeClock::now() + milliseconds(60), &wake));  // the delay ran out
}

TEST(Batcher, PriorityPicksTheAnchorAndVersionsNeverMix) {
  Batcher batcher({2, 100000, {}, 0, 100, true});
  auto a = Meta("a"), b = Meta("b");
  batcher.Push(Request(a, 10, 1, 10));
  batcher.Push(Request(b, 10, 1, 1));  // later but more urgent
  batcher.Push(Request(a, 10, 1, 10));
  auto first = batcher.Next(ServeClock::now() + milliseconds(1), nullptr);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->meta->model, "b");
  EXPECT_EQ(first->rows, 1);
  auto second = batcher.Next(ServeClock::now() + milliseconds(1), nullptr);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->meta->model, "a");
  EXPECT_EQ(second->rows, 2);
}

TEST(Batcher, LaterRequestsOvertakeOnlyWithinTheWindow) {
  // The window is kLengthWindowBatches x max_rows of the oldest requests: a request of an
  // odd length is not passed over by the many later ones of the anchor's length.
  Batcher batcher({2, 100000, {}, 0, 1000, true});
  auto meta = Meta();
  batcher.Push(Request(meta, 10));   // the anchor
  batcher.Push(Request(meta, 500));  // a length nobody else has
  for (int i = 0; i < 20; ++i) batcher.Push(Request(meta, 10));
  int batches_before = 0;
  for (;; ++batches_before) {
    auto batch = batcher.Next(ServeClock::now() + milliseconds(1), nullptr);
    ASSERT_TRUE(batch);
    if (Lengths(*batch).back() == 500) break;
  }
  EXPECT_LE(batches_before, 1);  // it is the oldest after the first batch, so it anchors the second
}

TEST(Batcher, BoundedQueue) {
  Batcher batcher({4, 100000, {}, 0, 2, true});
  auto meta = Meta();
  EXPECT_TRUE(batcher.Push(Request(meta, 5)));
  EXPECT_TRUE(batcher.Push(Request(meta, 5)));
  EXPECT_FALSE(batcher.Push(Request(meta, 5)));
  EXPECT_EQ(batcher.size(), 2u);
  EXPECT_EQ(batcher.queued_tokens(), 10);
}

TEST(Batcher, CancelledAndExpiredRequestsAreTakenOutNotBatched) {
  Batcher batcher({4, 100000, {}, 0, 100, true});
  auto meta = Meta();
  auto cancelled = Request(meta, 5);
  auto expiring = Request(meta, 5, 1, 10, milliseconds(10));
  auto kept = Request(meta, 5);
  for (auto& r : {cancelled, expiring, kept}) batcher.Push(r);
  cancelled->Cancel();
  auto dead = batcher.TakeDead(ServeClock::now() + milliseconds(20));
  ASSERT_EQ(dead.size(), 2u);
  auto batch = batcher.Next(ServeClock::now() + milliseconds(20), nullptr);
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->requests.size(), 1u);
  EXPECT_EQ(batch->requests[0], kept);
  EXPECT_EQ(batcher.queued_tokens(), 0);
}

// The sweep asks a bounded number of clients per call and goes on round the queue, so
// every queued request is asked within size / budget calls.
TEST(Batcher, SweepGoneAsksABoundedNumberOfClientsRoundTheQueue) {
  Batcher batcher({4, 100000, {}, 0, 100, true});
  auto meta = Meta();
  std::vector<int> asked(5, 0);
  std::vector<RequestPtr> requests;
  for (int i = 0; i < 5; ++i) {
    requests.push_back(Request(meta, 5));
    requests.back()->SetClientGone([&asked, i] {
      ++asked[i];
      return i == 3;
    });  // client 3 has hung up
    batcher.Push(requests.back());
  }
  batcher.SweepGone(2);
  EXPECT_EQ(asked, (std::vector<int>{1, 1, 0, 0, 0}));
  EXPECT_FALSE(requests[3]->cancelled());
  batcher.SweepGone(2);
  EXPECT_EQ(asked, (std::vector<int>{1, 1, 1, 1, 0}));
  EXPECT_TRUE(requests[3]->cancelled());
  batcher.SweepGone(2);  // the last one, then round to the first
  EXPECT_EQ(asked, (std::vector<int>{2, 1, 1, 1, 1}));
  batcher.SweepGone(100);                               // a budget past the queue asks each once
  EXPECT_EQ(asked, (std::vector<int>{3, 2, 2, 1, 2}));  // the cancelled one is not asked again
  EXPECT_EQ(batcher.TakeDead(ServeClock::now()).size(), 1u);
}

}  // namespace
}  // namespace trainyard
