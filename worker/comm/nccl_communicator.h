// The NCCL backend for GPU tensors: one NCCL communicator per job, its unique id
// broadcast over MPI, collectives on a dedicated CUDA stream ordered against the
// caller's stream with events. CPU tensors (small control values) go through the MPI
// communicator it was bootstrapped from. Compiled only when CUDA and NCCL are found
// (TRAINYARD_WITH_NCCL).
//
// Nothing here makes the host wait for the device: Work::Wait() only orders the
// caller's stream after the collective. Deadlines are kept by a watchdog thread that
// polls the in-flight collectives' events, in issue order, and NCCL's asynchronous
// error state. When a collective misses its deadline the watchdog hands the failure to
// the bootstrap MPI communicator, which asks every rank how many NCCL collectives it
// has issued (each rank reports it through SetDeviceProgress), logs the ranks that
// never issued this one, and aborts the job, as for a timed-out MPI collective.
// Collectives captured into a CUDA graph (train.cuda_graph) run at its replays and are
// not watched here.
#pragma once

#include <memory>
#include <thread>

#include "worker/comm/communicator.h"
#include "worker/comm/mpi_communicator.h"

namespace trainyard {

class NcclCommunicator : public Communicator {
 public:
  // Collective over `bootstrap`'s ranks, which must outlive this object. `device` is
  // this rank's GPU index.
  NcclCommunicator(MpiCommunicator& bootstrap, int device, double timeout_s);
  ~NcclCommunicator() override;

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  std::string backend() const override { return "nccl"; }
  std::string Host(int rank) const override { return bootstrap_.Host(rank); }

  std::shared_ptr<Work> AllReduceAsync(torch::Tensor tensor, ReduceOp op, std::string what) override;
  std::shared_ptr<Work> BroadcastAsync(torch::Tensor tensor, int root, std::string what) override;
  // CPU tensors only, through the bootstrap communicator.
  void AwaitBroadcast(torch::Tensor tensor, int root, std::string what) override {
    bootstrap_.AwaitBroadcast(std::move(tensor), root, std::move(what));
  }

  // The NCCL communicator, its stream and the in-flight list. Shared by the watchdog,
  // the MPI communicator's progress probe and every Work in flight.
  struct State;

 private:
  std::shared_ptr<Work> Launch(torch::Tensor tensor, bool broadcast, ReduceOp op, int root, std::string what);
  void Watch();

  MpiCommunicator& bootstrap_;
  std::shared_ptr<State> state_;
  std::thread watchdog_;
};

}  // namespace trainyard
