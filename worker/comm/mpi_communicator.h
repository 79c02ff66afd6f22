// The MPI backend: CPU tensors directly, GPU tensors staged through host memory.
//
// One comm thread owns every MPI call after construction (the design's "one loop
// thread owns a component's state"): callers enqueue collectives, the thread starts
// them as non-blocking MPI operations in queue order and polls them against their
// deadline. While it waits, and while idle, it also answers status requests on a
// separate control communicator.
//
// Hang attribution, when collective #k misses its deadline on this rank:
//   1. ask every other rank, on the control communicator, for its status: how many
//      collectives it has started and which one it is in;
//   2. collect answers for a short window (answering peers' requests meanwhile);
//   3. report the ranks that never reached #k: those that did not answer (stopped,
//      dead or deadlocked) and those whose count is below k (busy outside
//      communication), then keep answering peers for a moment so they can report too,
//      and abort the job (MPI_Abort), so no rank waits forever.
// REQUIRES: MPI initialised with at least MPI_THREAD_SERIALIZED, and no other thread
// calling MPI while a communicator exists.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "worker/comm/communicator.h"

namespace trainyard {

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm` (collective over it). `timeout_s` bounds every collective.
  MpiCommunicator(MPI_Comm comm, double timeout_s);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::shared_ptr<Work> AllReduceAsync(torch::Tensor tensor, ReduceOp op, std::string what) override;
  std::shared_ptr<Work> BroadcastAsync(torch::Tensor tensor, int root, std::string what) override;

 private:
  struct Operation;
  struct Status;

  std::shared_ptr<Work> Enqueue(std::shared_ptr<Operation> operation);
  void Loop();
  void Execute(Operation& operation);
  void ServeStatusRequests();
  [[noreturn]] void ReportHangAndAbort(const Operation& operation);
  std::string AttributeHang(const Operation& operation);
  void ServeFor(std::chrono::milliseconds duration);

  MPI_Comm data_comm_ = MPI_COMM_NULL, control_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::chrono::duration<double> timeout_;
  int64_t issued_ = 0;     // collectives enqueued (caller side)
  int64_t started_ = 0;    // collectives started (comm thread)
  std::string current_;    // description of the collective in progress
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Operation>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace trainyard
