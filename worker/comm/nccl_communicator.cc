#include "worker/comm/nccl_communicator.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/clock.h"
#include "common/log.h"

#define TY_NCCL_CHECK(call)                                                                            \
  do {                                                                                                 \
    ncclResult_t ty_nccl_result_ = (call);                                                             \
    if (ty_nccl_result_ != ncclSuccess)                                                                \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + #call + \
                               " failed: " + ncclGetErrorString(ty_nccl_result_));                     \
  } while (0)

namespace trainyard {
namespace {

ncclDataType_t NcclType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat:
      return ncclFloat32;
    case torch::kHalf:
      return ncclFloat16;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kDouble:
      return ncclFloat64;
    case torch::kInt:
      return ncclInt32;
    case torch::kLong:
      return ncclInt64;
    case torch::kByte:
      return ncclUint8;
    default:
      throw std::runtime_error(std::string("NCCL backend: unsupported dtype ") + c10::toString(type));
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// Throws unless `result` is success, or in progress and then completes (a nonblocking
// communicator's call may return before its enqueue is done) before `deadline`.
void AwaitCall(ncclComm_t comm, ncclResult_t result, const std::string& what, Clock::time_point deadline) {
  while (result == ncclInProgress) {
    if (Clock::now() > deadline) throw CollectiveTimeout("NCCL: " + what + " did not complete its set-up in time");
    std::this_thread::yield();
    ncclCommGetAsyncError(comm, &result);
  }
  if (result != ncclSuccess) throw std::runtime_error("NCCL: " + what + " failed: " + ncclGetErrorString(result));
}

}  // namespace

struct NcclCommunicator::State {
  struct InFlight {
    std::shared_ptr<at::cuda::CUDAEvent> done;
    int64_t number = 0;
    std::string what;
    Clock::time_point deadline;
  };

  State(int device, double timeout_s)
      : device(device),
        timeout(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device))) {}

  ncclComm_t comm = nullptr;
  const int device;
  const Clock::duration timeout;
  c10::cuda::CUDAStream stream;
  std::mutex mutex;  // guards what follows
  std::condition_variable wake;
  std::deque<InFlight> in_flight;  // in issue order, so also in completion order
  int64_t issued = 0;
  std::string newest_what;
  bool stopping = false;
};

namespace {

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> state, torch::Tensor tensor,
           std::shared_ptr<at::cuda::CUDAEvent> done)
      : state_(std::move(state)), tensor_(std::move(tensor)), done_(std::move(done)) {}
  // Later work on the caller's stream sees the result; the host does not wait.
  void Wait() override { done_->block(c10::cuda::getCurrentCUDAStream(state_->device)); }

 private:
  std::shared_ptr<NcclCommunicator::State> state_;
  torch::Tensor tensor_;  // kept alive while the caller holds the work
  std::shared_ptr<at::cuda::CUDAEvent> done_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MpiCommunicator& bootstrap, int device, double timeout_s)
    : bootstrap_(bootstrap), state_(std::make_shared<State>(device, timeout_s)) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  ncclUniqueId id;
  if (bootstrap_.rank() == 0) TY_NCCL_CHECK(ncclGetUniqueId(&id));
  torch::Tensor id_bytes = torch::zeros({int64_t(sizeof(id))}, torch::kByte);
  std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  bootstrap_.Broadcast(id_bytes, 0, "NCCL unique id");
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so initialisation, too, can be abandoned at the deadline
  const ncclResult_t result = ncclCommInitRankConfig(&state_->comm, bootstrap_.size(), id, bootstrap_.rank(), &config);
  AwaitCall(state_->comm, result, "communicator initialisation", Clock::now() + state_->timeout);
  bootstrap_.SetDeviceProgress([state = state_] {
    std::lock_guard<std::mutex> lock(state->mutex);
    return std::make_pair(state->issued, state->newest_what);
  });
  watchdog_ = std::thread([this] { Watch(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  bootstrap_.SetDeviceProgress(nullptr);
  if (state_->comm) {
    state_->stream.synchronize();  // nothing may be in flight when the communicator goes
    ncclCommDestroy(state_->comm);
  }
}

void NcclCommunicator::Watch() {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(state_->device));
  State& s = *state_;
  while (true) {
    std::optional<State::InFlight> overdue;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      s.wake.wait_for(lock, s.in_flight.empty() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1),
                      [&] { return s.stopping; });
      if (s.stopping) return;
      while (!s.in_flight.empty() && s.in_flight.front().done->query()) s.in_flight.pop_front();
      if (!s.in_flight.empty() && Clock::now() > s.in_flight.front().deadline) overdue = s.in_flight.front();
    }
    ncclResult_t async_error = ncclSuccess;
    ncclCommGetAsyncError(s.comm, &async_error);
    if (async_error != ncclSuccess && async_error != ncclInProgress)
      bootstrap_.AbortForDeviceFailure(
          StrFormat("rank %s: NCCL error: %s", RankName(rank()).c_str(), ncclGetErrorString(async_error)), 0);
    if (overdue) {  // how long it has waited since it was issued, as MpiCommunicator says it
      const double waited = std::chrono::duration<double>(Clock::now() - (overdue->deadline - s.timeout)).count();
      bootstrap_.AbortForDeviceFailure(
          StrFormat("rank %s: NCCL collective #%ld (%s) timed out after %.1f s", RankName(rank()).c_str(),
                    long(overdue->number), overdue->what.c_str(), waited),
          overdue->number);
    }
  }
}

std::shared_ptr<Work> NcclCommunicator::AllReduceAsync(torch::Tensor tensor, ReduceOp op, std::string what) {
  if (tensor.is_cpu()) return bootstrap_.AllReduceAsync(std::move(tensor), op, std::move(what));
  return Launch(std::move(tensor), false, op, 0, std::move(what));
}

std::shared_ptr<Work> NcclCommunicator::BroadcastAsync(torch::Tensor tensor, int root, std::string what) {
  if (tensor.is_cpu()) return bootstrap_.BroadcastAsync(std::move(tensor), root, std::move(what));
  return Launch(std::move(tensor), true, ReduceOp::kSum, root, std::move(what));
}

std::shared_ptr<Work> NcclCommunicator::Launch(torch::Tensor tensor, bool broadcast, ReduceOp op, int root,
                                               std::string what) {
  if (!tensor.is_contiguous()) throw std::invalid_argument("collective on a non-contiguous tensor");
  c10::cuda::CUDAGuard guard(tensor.device());
  State& s = *state_;
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  // The NCCL stream waits for the producer of `tensor` on the caller's stream (under
  // capture this joins the NCCL stream to the capture).
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(tensor.device().index()));
  ready.block(s.stream);
  const auto type = NcclType(tensor.scalar_type());
  const ncclResult_t result = broadcast ? ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type,
                                                        root, s.comm, s.stream.stream())
                                        : ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type,
                                                        NcclOp(op), s.comm, s.stream.stream());
  AwaitCall(s.comm, result, what, Clock::now() + s.timeout);
  c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), s.stream);
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(s.stream);
  // Captured into a CUDA graph (a graphed training step), the collective runs at each
  // replay, not now: its event is a dependency inside the graph, not one the watchdog
  // may query, and it counts as issued on no rank.
  if (capturing) return std::make_shared<NcclWork>(state_, std::move(tensor), std::move(done));
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    const int64_t number = ++s.issued;
    s.newest_what = what;
    s.in_flight.push_back({done, number, std::move(what), Clock::now() + s.timeout});
  }
  s.wake.notify_all();
  return std::make_shared<NcclWork>(state_, std::move(tensor), std::move(done));
}

}  // namespace trainyard
