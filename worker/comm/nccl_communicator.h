// The NCCL backend for GPU tensors: one NCCL communicator per job, its unique id
// broadcast over MPI, collectives on a dedicated CUDA stream ordered against the
// caller's stream with events. CPU tensors (small control values) go through the MPI
// communicator it was bootstrapped from. Every wait polls its event against the
// job's deadline and aborts the NCCL communicator on timeout.
// Compiled only when CUDA and NCCL are found (TRAINYARD_WITH_NCCL).
#pragma once

#include "worker/comm/communicator.h"
#include "worker/comm/mpi_communicator.h"

namespace trainyard {

class NcclCommunicator : public Communicator {
 public:
  // Collective over `bootstrap`'s ranks. `device` is this rank's GPU index.
  NcclCommunicator(MpiCommunicator& bootstrap, int device, double timeout_s);
  ~NcclCommunicator() override;

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  std::string backend() const override { return "nccl"; }

  struct State;  // the NCCL communicator and its stream; shared with in-flight work

  std::shared_ptr<Work> AllReduceAsync(torch::Tensor tensor, ReduceOp op, std::string what) override;
  std::shared_ptr<Work> BroadcastAsync(torch::Tensor tensor, int root, std::string what) override;

 private:
  std::shared_ptr<Work> Launch(torch::Tensor tensor, bool broadcast, ReduceOp op, int root, std::string what);

  MpiCommunicator& bootstrap_;
  std::unique_ptr<State> state_;
};

}  // namespace trainyard
