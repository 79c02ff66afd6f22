// The replica ring (Note [The replica ring]) over real loopback TCP, one thread a member:
// sums against an fp64 reference, the handshake's refusals, and a member that dies or
// freezes mid-operation.
#include "worker/elastic/tcp_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace trainyard {
namespace {

// What one member's thread came to: the ring's failure, if it had one, and when.
struct Outcome {
  std::optional<RingFailure> failure;
  double seconds = 0;  // from the start of `body` to its end or failure
};

struct Member {
  uint64_t epoch = 7;
  std::string secret = "the job's secret";
};

// Forms a ring of `listeners.size()` members (member i as `members[i]` says), each in a
// thread of its own, and runs `body` on each formed ring; every member's outcome.
std::vector<Outcome> OnRing(std::vector<std::unique_ptr<RingListener>>& listeners, const std::vector<Member>& members,
                            const std::function<void(int, TcpRing&)>& body, double timeout_s = 10) {
  std::vector<RingMember> addresses;
  for (const auto& listener : listeners) addresses.push_back({"127.0.0.1", listener->port()});
  std::vector<Outcome> outcomes(members.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); ++i)
    threads.emplace_back([&, i] {
      const double start = SteadySeconds();
      try {
        TcpRing ring(*listeners[i], addresses, static_cast<int>(i), members[i].epoch,
                     RingOptions{timeout_s, members[i].secret});
        body(static_cast<int>(i), ring);
      } catch (const RingFailure& e) {
        outcomes[i].failure = e;
      }
      outcomes[i].seconds = SteadySeconds() - start;
    });
  for (auto& t : threads) t.join();
  return outcomes;
}

std::vector<std::unique_ptr<RingListener>> Listeners(int n) {
  std::vector<std::unique_ptr<RingListener>> listeners;
  for (int i = 0; i < n; ++i) listeners.push_back(std::make_unique<RingListener>());
  return listeners;
}

// Member `m`'s contribution: values of either sign and of different magnitudes.
float Value(int m, size_t i) {
  return static_cast<float>(std::sin(0.37 * double(i) + 1.3 * m) * std::pow(10.0, double((i + m) % 5) - 2));
}

// Every member ends with the same bits, each within the error bound of summing n floats
// in some order: |sum - exact| <= (n - 1) u sum|x| with u = 2^-24, float's unit roundoff
// (Higham, Accuracy and Stability of Numerical Algorithms, 4.2), against the fp64 sum.
TEST(TcpRingTest, AllReduceSumsOnEveryRingSizeAndEveryMemberEndsWithTheSameBits) {
  for (int n = 1; n <= 5; ++n) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
      auto listeners = Listeners(n);
      std::vector<std::vector<float>> data(n, std::vector<float>(count));
      OnRing(listeners, std::vector<Member>(n), [&](int m, TcpRing& ring) {
        for (size_t i = 0; i < count; ++i) data[m][i] = Value(m, i);
        ring.AllReduceSum(data[m].data(), count);
      });
      for (size_t i = 0; i < count; ++i) {
        double exact = 0, magnitude = 0;
        for (int m = 0; m < n; ++m) {
          exact += Value(m, i);
          magnitude += std::fabs(Value(m, i));
        }
        const double bound = (n - 1) * std::ldexp(1.0, -24) * magnitude;
        ASSERT_LE(std::fabs(data[0][i] - exact), bound) << n << " members, element " << i << " of " << count;
      }
      for (int m = 1; m < n; ++m)
        ASSERT_EQ(std::memcmp(data[m].data(), data[0].data(), count * sizeof(float)), 0) << "member " << m;
    }
  }
}

TEST(TcpRingTest, BroadcastCarriesTheRootsBytesToEveryMember) {
  auto listeners = Listeners(4);
  std::vector<std::string> got(4, std::string(100000, '\0'));
  OnRing(listeners, std::vector<Member>(4), [&](int m, TcpRing& ring) {
    if (m == 2)
      for (size_t i = 0; i < got[m].size(); ++i) got[m][i] = static_cast<char>(i * 31 + 7);
    ring.Broadcast(got[m].data(), got[m].size(), 2);
  });
  for (int m = 0; m < 4; ++m) EXPECT_EQ(got[m], got[2]) << "member " << m;
}

// A member without the job's secret, or of another membership, cannot join: each end
// names it and why, and nothing is exchanged.
TEST(TcpRingTest, AMemberWithoutTheSecretOrOfAnOldMembershipIsRefused) {
  auto listeners = Listeners(2);
  std::vector<Member> members(2);
  members[1].secret = "a guess";
  auto outcomes = OnRing(
      listeners, members, [](int, TcpRing&) { FAIL() << "a ring formed"; }, 1.5);
  ASSERT_TRUE(outcomes[0].failure);
  EXPECT_EQ(outcomes[0].failure->neighbour(), 1);
  EXPECT_NE(std::string(outcomes[0].failure->what()).find("proof of the secret failed"), std::string::npos)
      << outcomes[0].failure->what();
  ASSERT_TRUE(outcomes[1].failure);

  members = std::vector<Member>(2);
  members[1].epoch = 6;  // a replica back from a partition with the membership before
  outcomes = OnRing(
      listeners, members, [](int, TcpRing&) { FAIL() << "a ring formed"; }, 1.5);
  ASSERT_TRUE(outcomes[0].failure);
  EXPECT_NE(std::string(outcomes[0].failure->what()).find("it is of membership 6, not 7"), std::string::npos)
      << outcomes[0].failure->what();
}

// A member that leaves mid-ring (its process died: its connections close) fails the
// next member's operation at once, naming it; the survivors then form a new ring, a
// new membership on the same listeners, and sum over it.
TEST(TcpRingTest, ADeadMemberFailsTheNextOneAtOnceAndTheSurvivorsFormANewRing) {
  auto listeners = Listeners(3);
  std::vector<std::vector<float>> data(3, std::vector<float>(1 << 16, 1.0f));
  const auto outcomes = OnRing(listeners, std::vector<Member>(3), [&](int m, TcpRing& ring) {
    if (m != 2) ring.AllReduceSum(data[m].data(), data[m].size());
  });
  EXPECT_FALSE(outcomes[2].failure);
  ASSERT_TRUE(outcomes[0].failure);
  EXPECT_EQ(outcomes[0].failure->neighbour(), 2) << outcomes[0].failure->what();
  EXPECT_NE(std::string(outcomes[0].failure->what()).find("closed the connection"), std::string::npos);
  EXPECT_LT(outcomes[0].seconds, 5.0) << "a closed connection fails at once, not at the deadline";
  ASSERT_TRUE(outcomes[1].failure);

  std::vector<std::unique_ptr<RingListener>> survivors;
  survivors.push_back(std::move(listeners[0]));
  survivors.push_back(std::move(listeners[1]));
  std::vector<Member> next(2);
  next[0].epoch = next[1].epoch = 8;
  std::vector<std::vector<float>> sums(2, std::vector<float>(1000, 0.5f));
  const auto again = OnRing(survivors, next, [&](int m, TcpRing& ring) {
    EXPECT_EQ(ring.epoch(), 8u);
    ring.AllReduceSum(sums[m].data(), sums[m].size());
  });
  EXPECT_FALSE(again[0].failure);
  EXPECT_FALSE(again[1].failure);
  EXPECT_EQ(sums[0], std::vector<float>(1000, 1.0f));
  EXPECT_EQ(sums[1], sums[0]);
}

// A member that is alive but frozen (its connections open, never read: a process under
// SIGSTOP, a hung step) fails the others' operation at the deadline, not later.
TEST(TcpRingTest, AFrozenMemberFailsTheOthersAtTheDeadline) {
  auto listeners = Listeners(3);
  constexpr double kTimeout = 1.0;
  std::vector<std::vector<float>> data(3, std::vector<float>(size_t{1} << 22, 1.0f));  // 16 MiB: fills the buffers
  std::atomic<int> done{0};
  const auto outcomes = OnRing(
      listeners, std::vector<Member>(3),
      [&](int m, TcpRing& ring) {
        if (m == 2) {  // frozen until the others are through
          while (done.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        try {
          ring.AllReduceSum(data[m].data(), data[m].size());
        } catch (...) {
          ++done;
          throw;
        }
        ++done;
      },
      kTimeout);
  for (int m : {0, 1}) {
    ASSERT_TRUE(outcomes[m].failure) << "member " << m;
    EXPECT_GE(outcomes[m].seconds, kTimeout * 0.9) << outcomes[m].failure->what();
    EXPECT_LT(outcomes[m].seconds, kTimeout + 3) << outcomes[m].failure->what();
  }
  const std::string said = std::string(outcomes[0].failure->what()) + "\n" + outcomes[1].failure->what();
  EXPECT_NE(said.find("before the deadline"), std::string::npos) << said;
}

}  // namespace
}  // namespace trainyard
