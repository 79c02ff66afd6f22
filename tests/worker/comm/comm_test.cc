// The MPI communicator and the reducer, run with real ranks: ctest starts this binary
// under mpirun -n 2 and -n 4.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "worker/comm/mpi_communicator.h"
#include "worker/comm/reducer.h"

namespace trainyard {
namespace {

std::unique_ptr<MpiCommunicator> g_comm;  // made after MPI_Init, destroyed before MPI_Finalize

MpiCommunicator& Comm() { return *g_comm; }

// Whether `got`, the reducer's mean of the ranks' gradients, equals `expected`, the same
// mean summed here in rank order, within their rounding. Each sums N terms in its own
// order and divides once, so each is within N + 1 roundings of the exact mean, relative
// to `magnitude`, the mean of the terms' magnitudes; two such results differ by at most
// twice that. `unit` is one rounding: float32's 2^-24, or fp16's 2^-11 where the wire
// carries fp16 (each term and each partial sum rounded to it), which also cannot tell
// apart values closer than its smallest step, 2^-24.
::testing::AssertionResult SameMean(const torch::Tensor& got, const torch::Tensor& expected,
                                    const torch::Tensor& magnitude, bool fp16 = false) {
  const double unit = std::ldexp(1.0, fp16 ? -11 : -24);
  const double roundings = Comm().size() + 1 + (fp16 ? Comm().size() : 0);
  const torch::Tensor bound = 2 * roundings * unit * magnitude.to(torch::kDouble) + (fp16 ? std::ldexp(1.0, -24) : 0.0);
  const torch::Tensor excess = (got.to(torch::kDouble) - expected.to(torch::kDouble)).abs() - bound;
  if (excess.max().item<double>() > 0)
    return ::testing::AssertionFailure() << "off by " << (excess + bound).max().item<double>() << " where the bound is "
                                         << bound.flatten()[excess.flatten().argmax()].item<double>();
  return ::testing::AssertionSuccess();
}

// The mean over the ranks of each parameter's gradient, and of its magnitude, summed here
// in rank order: what SameMean holds the reducer's result against.
struct RankMean {
  // Zeros shaped as `params`: the mean of no rank's gradient.
  explicit RankMean(const std::vector<torch::Tensor>& params) {
    for (const auto& p : params) {
      value.push_back(torch::zeros_like(p));
      magnitude.push_back(torch::zeros_like(p));
    }
  }
  std::vector<torch::Tensor> value, magnitude;
  void Add(const std::vector<torch::Tensor>& grads) {
    for (size_t i = 0; i < grads.size(); ++i) {
      value[i] += grads[i] / Comm().size();
      magnitude[i] += grads[i].abs() / Comm().size();
    }
  }
};

TEST(MpiCommunicator, AllReduceSumMaxMin) {
  const int r = Comm().rank(), n = Comm().size();
  torch::Tensor t = torch::tensor({float(r), float(r) * 2, 1.0f});
  Comm().AllReduce(t, ReduceOp::kSum, "sum");
  EXPECT_FLOAT_EQ(t[0].item<float>(), n * (n - 1) / 2.0f);
  EXPECT_FLOAT_EQ(t[2].item<float>(), float(n));
  torch::Tensor m = torch::tensor({int64_t(r)});
  Comm().AllReduce(m, ReduceOp::kMax, "max");
  EXPECT_EQ(m.item<int64_t>(), n - 1);
  torch::Tensor d = torch::tensor({double(r) + 0.5});
  Comm().AllReduce(d, ReduceOp::kMin, "min");
  EXPECT_DOUBLE_EQ(d.item<double>(), 0.5);
}

TEST(MpiCommunicator, Fp16SumAddsInFloat) {
  torch::Tensor t = torch::full({1000}, 0.25 * (Comm().rank() + 1), torch::kHalf);
  Comm().AllReduce(t, ReduceOp::kSum, "fp16 sum");
  const int n = Comm().size();
  EXPECT_FLOAT_EQ(t[999].item<float>(), 0.25f * n * (n + 1) / 2);
}

TEST(MpiCommunicator, BroadcastAllGatherAnyTrue) {
  torch::Tensor t = torch::full({3}, float(Comm().rank() + 7));
  Comm().Broadcast(t, 1 % Comm().size(), "bcast");
  EXPECT_FLOAT_EQ(t[0].item<float>(), float(1 % Comm().size() + 7));
  auto all = Comm().AllGather({double(Comm().rank()), 1.5}, "gather");
  ASSERT_EQ(int(all.size()), Comm().size());
  for (int r = 0; r < Comm().size(); ++r) EXPECT_EQ(all[r][0], double(r));
  EXPECT_TRUE(Comm().AnyTrue(Comm().rank() == Comm().size() - 1, "any"));
  EXPECT_FALSE(Comm().AnyTrue(false, "none"));
}

// Every byte value, from every rank, arrives as it was: the bytes RNG states are made of.
TEST(MpiCommunicator, AllGatherBytesIsExact) {
  std::vector<uint8_t> mine(300);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>((i * 7 + size_t(Comm().rank()) * 31) & 0xFF);
  const auto all = Comm().AllGatherBytes(mine, "gather bytes");
  ASSERT_EQ(int(all.size()), Comm().size());
  for (int r = 0; r < Comm().size(); ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      ASSERT_EQ(all[r][i], static_cast<uint8_t>((i * 7 + size_t(r) * 31) & 0xFF)) << "rank " << r << " byte " << i;
  EXPECT_TRUE(Comm().AllGatherBytes({}, "no bytes")[0].empty());
}

TEST(MpiCommunicator, AsyncCollectivesCompleteInOrder) {
  std::vector<torch::Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 20; ++i) {
    tensors.push_back(torch::full({1000}, float(i)));
    works.push_back(Comm().AllReduceAsync(tensors.back(), ReduceOp::kSum, "async"));
  }
  for (int i = 0; i < 20; ++i) {
    works[i]->Wait();
    EXPECT_FLOAT_EQ(tensors[i][500].item<float>(), float(i * Comm().size()));
  }
}

// Each rank feeds its own data through a small network; the reducer must leave every
// rank with the average of all ranks' gradients, for any bucketing and either mode.
void CheckReducerAverages(int64_t bucket_bytes, bool overlap, bool fp16) {
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
  auto loss_on = [&](int rank) {
    torch::manual_seed(100 + rank);
    return net->forward(torch::randn({8, 16})).pow(2).mean();
  };
  RankMean expected(net->parameters());
  for (int r = 0; r < Comm().size(); ++r) {
    net->zero_grad();
    loss_on(r).backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : net->parameters()) grads.push_back(p.grad().clone());
    expected.Add(grads);
  }
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  Reducer reducer(named, Comm(), ReducerOptions{bucket_bytes, overlap, fp16});
  reducer.PrepareForBackward();
  loss_on(Comm().rank()).backward();
  reducer.FinishBackward();
  for (size_t i = 0; i < expected.value.size(); ++i)
    EXPECT_TRUE(SameMean(net->parameters()[i].grad(), expected.value[i], expected.magnitude[i], fp16))
        << "parameter " << i << " bucket_bytes " << bucket_bytes;
}

TEST(Reducer, AveragesGradientsAcrossRanks) {
  CheckReducerAverages(1 << 20, true, false);  // one bucket
  CheckReducerAverages(256, true, false);      // one bucket per parameter, overlapped
  CheckReducerAverages(256, false, false);     // all after backward
  CheckReducerAverages(700, true, true);       // fp16 on the wire
}

struct TinyNet {
  torch::nn::Linear first{16, 8}, second{8, 2};
  std::vector<std::pair<std::string, torch::Tensor>> Named() {
    return {{"first.weight", first->weight},
            {"first.bias", first->bias},
            {"second.weight", second->weight},
            {"second.bias", second->bias}};
  }
  torch::Tensor Loss(int seed) {
    torch::manual_seed(seed);
    return second->forward(torch::tanh(first->forward(torch::randn({4, 16})))).pow(2).sum();
  }
  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> params;
    for (auto& [name, p] : Named()) params.push_back(p);
    return params;
  }
  // Loss(seed)'s gradient of each parameter, in Named() order, computed here alone.
  std::vector<torch::Tensor> Gradients(int seed) { return torch::autograd::grad({Loss(seed)}, Parameters()); }
};

// Gradients are accumulated into the buckets themselves, and every step starts from zero.
TEST(Reducer, GradientsAreViewsOfTheBucketsAcrossSteps) {
  torch::manual_seed(5);
  TinyNet net;
  Reducer reducer(net.Named(), Comm(), ReducerOptions{1 << 20, true, false});
  for (int step = 0; step < 3; ++step) {
    // The expected average, computed locally without hooks' help: every rank's loss.
    TinyNet copy;
    RankMean expected(copy.Parameters());
    {
      torch::NoGradGuard no_grad;
      auto to = copy.Named(), from = net.Named();
      for (size_t i = 0; i < to.size(); ++i) to[i].second.copy_(from[i].second);
    }
    for (int r = 0; r < Comm().size(); ++r) expected.Add(copy.Gradients(1000 * step + r));
    reducer.PrepareForBackward();
    net.Loss(1000 * step + Comm().rank()).backward();
    reducer.FinishBackward();
    auto named = net.Named();
    for (size_t i = 0; i < named.size(); ++i)
      EXPECT_TRUE(SameMean(named[i].second.grad(), expected.value[i], expected.magnitude[i]))
          << named[i].first << " step " << step;
    // One bucket: all four .grad tensors live in the same buffer.
    const void* storage = named[0].second.grad().storage().data();
    for (auto& [name, p] : named) EXPECT_EQ(p.grad().storage().data(), storage) << name;
  }
}

TEST(Reducer, StopVotesRideWithTheGradients) {
  TinyNet net;
  Reducer reducer(net.Named(), Comm(), ReducerOptions{256, true, false});
  for (int voter = -1; voter < Comm().size(); ++voter) {
    reducer.PrepareForBackward(/*stop_vote=*/Comm().rank() == voter);
    net.Loss(Comm().rank()).backward();
    reducer.FinishBackward();
    EXPECT_EQ(reducer.StopVotes().item<float>() > 0, voter >= 0) << "voter " << voter;
  }
}

// A rank with no examples contributes zeros, and the others' gradients are still averaged
// over the whole world.
TEST(Reducer, ARankWithoutExamplesContributesZeros) {
  torch::manual_seed(6);
  TinyNet net;
  RankMean expected(net.Parameters());
  for (int r = 1; r < Comm().size(); ++r) expected.Add(net.Gradients(r));
  Reducer reducer(net.Named(), Comm(), ReducerOptions{256, true, false});
  reducer.PrepareForBackward();
  if (Comm().rank() == 0) {
    reducer.ContributeWithoutBackward();
  } else {
    net.Loss(Comm().rank()).backward();
  }
  reducer.FinishBackward();
  auto named = net.Named();
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(SameMean(named[i].second.grad(), expected.value[i], expected.magnitude[i])) << named[i].first;
}

// Gradient accumulation: two backward passes a step, the first accumulating. The
// buckets are all-reduced once, in the second, and hold the ranks' mean of each rank's
// summed gradients; rank 0's second micro-batch is empty, so it contributes its first's.
TEST(Reducer, AccumulatedMicroBatchesAreReducedOnceAsTheirSum) {
  torch::manual_seed(7);
  TinyNet net;
  const int world = Comm().size();
  RankMean expected(net.Parameters());
  for (int r = 0; r < world; ++r) {
    std::vector<torch::Tensor> sum = net.Gradients(r);
    if (r != 0)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += net.Gradients(r + world)[i];
    expected.Add(sum);
  }
  Reducer reducer(net.Named(), Comm(), ReducerOptions{256, true, false});
  reducer.PrepareForBackward();
  reducer.set_accumulating(true);
  net.Loss(Comm().rank()).backward();
  reducer.set_accumulating(false);
  if (Comm().rank() == 0)
    reducer.ContributeWithoutBackward();
  else
    net.Loss(Comm().rank() + world).backward();
  reducer.FinishBackward();
  auto named = net.Named();
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(SameMean(named[i].second.grad(), expected.value[i], expected.magnitude[i])) << named[i].first;
}

TEST(Reducer, MisuseIsCaughtAndHooksGoWithTheReducer) {
  TinyNet net;
  {
    Reducer reducer(net.Named(), Comm(), ReducerOptions{256, true, false});
    EXPECT_THROW(net.Loss(0).backward(), std::exception);  // a gradient outside a step
    EXPECT_THROW(reducer.FinishBackward(), std::logic_error);
    reducer.PrepareForBackward();
    EXPECT_THROW(reducer.PrepareForBackward(), std::logic_error);
    net.Loss(Comm().rank()).backward();
    reducer.FinishBackward();
  }
  // With the reducer gone, backward is plain autograd again.
  for (auto& [name, p] : net.Named()) p.mutable_grad() = torch::Tensor();
  net.Loss(0).backward();
  for (auto& [name, p] : net.Named()) EXPECT_TRUE(p.grad().defined()) << name;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  trainyard::g_comm = std::make_unique<trainyard::MpiCommunicator>(MPI_COMM_WORLD, 60.0);
  int failed = RUN_ALL_TESTS();
  const bool any_failed = trainyard::Comm().AnyTrue(failed != 0, "verdict");
  trainyard::g_comm.reset();  // joins the comm thread, which owns MPI until then
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
