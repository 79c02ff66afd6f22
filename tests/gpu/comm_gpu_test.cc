// The communicators with GPU tensors, with real ranks sharing one GPU: ctest runs this
// binary under mpirun -n 1, 2 and 4. The MPI backend stages CUDA tensors through
// pinned host memory; the NCCL backend runs where every rank has a GPU of its own
// (with one GPU: the 1-rank run). Exits 77 (skipped) where no CUDA device is visible.
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>

#include "worker/comm/mpi_communicator.h"
#include "worker/comm/reducer.h"
#ifdef TRAINYARD_WITH_NCCL
#include "worker/comm/nccl_communicator.h"
#endif

namespace trainyard {
namespace {

std::unique_ptr<MpiCommunicator> g_mpi;  // made after MPI_Init, destroyed before MPI_Finalize

MpiCommunicator& Mpi() { return *g_mpi; }
torch::Device Gpu() { return torch::Device(torch::kCUDA, 0); }

void CheckAllReduceAndBroadcast(Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
  torch::Tensor t = torch::tensor({float(r), 1.0f, 2.5f}, torch::TensorOptions().device(Gpu()));
  comm.AllReduce(t, ReduceOp::kSum, "cuda sum");
  torch::Tensor host = t.cpu();
  EXPECT_FLOAT_EQ(host[0].item<float>(), n * (n - 1) / 2.0f);
  EXPECT_FLOAT_EQ(host[2].item<float>(), 2.5f * n);
  torch::Tensor b = torch::full({1000}, double(r + 3), torch::TensorOptions(torch::kDouble).device(Gpu()));
  comm.Broadcast(b, n - 1, "cuda broadcast");
  EXPECT_DOUBLE_EQ(b.cpu()[999].item<double>(), double(n - 1 + 3));
  std::vector<torch::Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 10; ++i) {
    tensors.push_back(torch::full({1 << 16}, float(i), torch::TensorOptions().device(Gpu())));
    works.push_back(comm.AllReduceAsync(tensors.back(), ReduceOp::kSum, "cuda async"));
  }
  for (int i = 0; i < 10; ++i) {
    works[i]->Wait();
    EXPECT_FLOAT_EQ(tensors[i][12345].item<float>(), float(i * n));
  }
}

// Every rank's gradients of a small network on the GPU, averaged by the reducer,
// equal the average computed locally.
void CheckReducerOnGpu(Communicator& comm) {
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  net->to(Gpu());
  auto loss_on = [&](int rank) {
    torch::manual_seed(100 + rank);
    return net->forward(torch::randn({8, 16}).to(Gpu())).pow(2).mean();
  };
  std::vector<torch::Tensor> expected;
  for (auto& p : net->parameters()) expected.push_back(torch::zeros_like(p));
  for (int r = 0; r < comm.size(); ++r) {
    net->zero_grad();
    loss_on(r).backward();
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += net->parameters()[i].grad() / comm.size();
  }
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
  Reducer reducer(named, comm, ReducerOptions{256, true, false});
  for (int step = 0; step < 2; ++step) {
    reducer.PrepareForBackward(/*stop_vote=*/step == 1 && comm.rank() == comm.size() - 1);
    loss_on(comm.rank()).backward();
    reducer.FinishBackward();
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(torch::allclose(net->parameters()[i].grad(), expected[i], 1e-6, 1e-6)) << "parameter " << i;
    EXPECT_EQ(reducer.StopVotes().item<float>() > 0, step == 1);
  }
}

TEST(MpiCommunicatorOnGpu, StagesCudaTensorsThroughPinnedMemory) { CheckAllReduceAndBroadcast(Mpi()); }

TEST(MpiCommunicatorOnGpu, ReducerAveragesCudaGradients) { CheckReducerOnGpu(Mpi()); }

#ifdef TRAINYARD_WITH_NCCL
bool EachRankHasAGpu() { return static_cast<int>(torch::cuda::device_count()) >= Mpi().size(); }

TEST(NcclCommunicator, CollectivesAndReducer) {
  if (!EachRankHasAGpu()) GTEST_SKIP() << "NCCL needs a GPU per rank; " << Mpi().size() << " ranks share fewer";
  NcclCommunicator nccl(Mpi(), Mpi().rank(), 60.0);
  CheckAllReduceAndBroadcast(nccl);
  CheckReducerOnGpu(nccl);
}

// Wait() orders the caller's stream after the collective; the host goes on at once.
TEST(NcclCommunicator, WaitDoesNotBlockTheHost) {
  if (!EachRankHasAGpu()) GTEST_SKIP() << "NCCL needs a GPU per rank; " << Mpi().size() << " ranks share fewer";
  NcclCommunicator nccl(Mpi(), Mpi().rank(), 60.0);
  torch::Tensor t = torch::ones({1 << 20}, torch::TensorOptions().device(Gpu()));
  at::cuda::sleep(2'000'000'000);  // ~1 s of device work queued ahead of the collective
  const auto start = std::chrono::steady_clock::now();
  nccl.AllReduceAsync(t, ReduceOp::kSum, "behind a long kernel")->Wait();
  const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("launch + Wait() behind ~1 s of device work took %.2f ms on the host\n", host_ms);
  EXPECT_LT(host_ms, 100.0);
  EXPECT_FLOAT_EQ(t[7].item<float>(), float(Mpi().size()));  // .item() waits; the value is reduced
}
#endif

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (!torch::cuda::is_available()) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::printf("skipped: no CUDA device is visible\n");
    MPI_Finalize();
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  trainyard::g_mpi = std::make_unique<trainyard::MpiCommunicator>(MPI_COMM_WORLD, 60.0);
  int failed = RUN_ALL_TESTS();
  const bool any_failed = trainyard::Mpi().AnyTrue(failed != 0, "verdict");
  trainyard::g_mpi.reset();  // joins the comm thread, which owns MPI until then
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
