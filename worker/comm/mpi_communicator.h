// The MPI backend: CPU tensors directly, GPU tensors staged through pinned host memory
// (copied asynchronously on the caller's stream; the comm thread waits for the copy's
// event before MPI touches the buffer, and the result goes back asynchronously too).
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
// The same attribution serves a device communicator layered on this one (NCCL): it
// registers a probe of how many device collectives this rank has issued, which every
// status reply carries, and its watchdog asks for a report when one of them hangs.
// REQUIRES: MPI initialised with at least MPI_THREAD_SERIALIZED, and no other thread
// calling MPI while a communicator exists.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/communicator.h"

namespace trainyard {

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `comm` and learns where every rank runs (collective over it). `timeout_s`
  // bounds every collective.
  MpiCommunicator(MPI_Comm comm, double timeout_s);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::string Host(int rank) const override;

  std::shared_ptr<Work> AllReduceAsync(torch::Tensor tensor, ReduceOp op, std::string what) override;
  std::shared_ptr<Work> BroadcastAsync(torch::Tensor tensor, int root, std::string what) override;
  void AwaitBroadcast(torch::Tensor tensor, int root, std::string what) override;

  // How many collectives of a layered device communicator this rank has issued, and
  // the newest one's description. Called on the comm thread; must be thread-safe.
  using DeviceProgress = std::function<std::pair<int64_t, std::string>()>;
  void SetDeviceProgress(DeviceProgress probe);

  // From another thread (a device communicator's watchdog): logs `error` and, when
  // `hung_number` > 0, which ranks never issued device collective #hung_number, then
  // aborts the job as a timed-out MPI collective does. Never returns.
  [[noreturn]] void AbortForDeviceFailure(std::string error, int64_t hung_number);

  // Called, on the comm thread, with the report of a hang or device failure just before
  // this rank aborts the job (after the report is logged). Set before the first
  // collective; must not block. What it throws is logged, and the abort goes on.
  using AbortNotice = std::function<void(const std::string& error)>;
  void SetAbortNotice(AbortNotice notice);

 private:
  struct Operation;
  struct Status;
  struct DeviceFailure {
    std::string error;
    int64_t hung_number = 0;
  };

  void GatherHosts();
  std::shared_ptr<Work> Enqueue(std::shared_ptr<Operation> operation);
  void Loop();
  void Execute(Operation& operation);
  void ServeStatusRequests();
  void HandleDeviceFailure();
  [[noreturn]] void ReportAndAbort(const std::string& error);
  // "; rank r did not reach it (...)" for every rank that had not started collective
  // #number of this communicator (or, with `device`, of the layered one).
  std::string AttributeHang(int64_t number, bool device);
  void ServeFor(std::chrono::milliseconds duration);

  MPI_Comm data_comm_ = MPI_COMM_NULL, control_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;  // by rank: the hostname each runs on
  std::chrono::duration<double> timeout_;
  int64_t issued_ = 0;   // collectives enqueued (caller side)
  int64_t started_ = 0;  // collectives started (comm thread)
  std::string current_;  // description of the collective in progress
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Operation>> queue_;
  bool stopping_ = false;
  DeviceProgress device_progress_;               // guarded by mutex_
  AbortNotice abort_notice_;                     // guarded by mutex_
  std::optional<DeviceFailure> device_failure_;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace trainyard
