#include "worker/comm/nccl_communicator.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "worker/log.h"

#define TY_CUDA_CHECK(call)                                                                      \
  do {                                                                                           \
    cudaError_t ty_cuda_error_ = (call);                                                         \
    if (ty_cuda_error_ != cudaSuccess)                                                           \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + #call + \
                               " failed: " + cudaGetErrorString(ty_cuda_error_));                \
  } while (0)

#define TY_NCCL_CHECK(call)                                                                      \
  do {                                                                                           \
    ncclResult_t ty_nccl_result_ = (call);                                                       \
    if (ty_nccl_result_ != ncclSuccess && ty_nccl_result_ != ncclInProgress)                     \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + #call + \
                               " failed: " + ncclGetErrorString(ty_nccl_result_));               \
  } while (0)

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return ncclFloat32;
    case torch::kHalf: return ncclFloat16;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kDouble: return ncclFloat64;
    case torch::kInt: return ncclInt32;
    case torch::kLong: return ncclInt64;
    case torch::kByte: return ncclUint8;
    default: throw std::runtime_error(std::string("NCCL backend: unsupported dtype ") + c10::toString(type));
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  int device = 0;
  std::chrono::duration<double> timeout{300.0};
  c10::cuda::CUDAStream stream;
  int64_t issued = 0;

  // Polls NCCL's asynchronous error state until `ready()` or the deadline.
  template <typename Ready>
  void WaitUntil(Ready ready, int64_t number, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
    while (!ready()) {
      ncclResult_t async_error = ncclSuccess;
      ncclCommGetAsyncError(comm, &async_error);
      if (async_error != ncclSuccess && async_error != ncclInProgress)
        throw std::runtime_error(std::string("NCCL error during ") + what + ": " + ncclGetErrorString(async_error));
      if (Clock::now() > deadline) {
        ncclCommAbort(comm);
        comm = nullptr;
        throw CollectiveTimeout(StrFormat("NCCL collective #%ld (%s) timed out after %.1f s", long(number),
                                          what.c_str(), timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
};

namespace {

class NcclWork : public Work {
 public:
  NcclWork(NcclCommunicator::State* state, torch::Tensor tensor, int64_t number, std::string what)
      : state_(state), tensor_(std::move(tensor)), number_(number), what_(std::move(what)) {
    done_.record(state_->stream);
  }
  void Wait() override {
    state_->WaitUntil([&] { return done_.query(); }, number_, what_);
    // Later work on the caller's stream sees the reduced values.
    done_.block(c10::cuda::getCurrentCUDAStream(state_->device));
  }

 private:
  NcclCommunicator::State* state_;
  torch::Tensor tensor_;  // kept alive until the collective is done
  int64_t number_;
  std::string what_;
  at::cuda::CUDAEvent done_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MpiCommunicator& bootstrap, int device, double timeout_s)
    : bootstrap_(bootstrap),
      state_(new State{nullptr, device, std::chrono::duration<double>(timeout_s),
                       c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)}) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  ncclUniqueId id;
  if (bootstrap_.rank() == 0) TY_NCCL_CHECK(ncclGetUniqueId(&id));
  torch::Tensor id_bytes = torch::zeros({int64_t(sizeof(id))}, torch::kByte);
  std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  bootstrap_.Broadcast(id_bytes, 0, "NCCL unique id");
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so initialisation, too, can be abandoned at the deadline
  TY_NCCL_CHECK(ncclCommInitRankConfig(&state_->comm, bootstrap_.size(), id, bootstrap_.rank(), &config));
  state_->WaitUntil(
      [&] {
        ncclResult_t status = ncclInProgress;
        ncclCommGetAsyncError(state_->comm, &status);
        return status == ncclSuccess;
      },
      0, "NCCL communicator initialisation");
}

NcclCommunicator::~NcclCommunicator() {
  if (state_->comm) ncclCommDestroy(state_->comm);
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
  // The NCCL stream waits for the producer of `tensor` on the caller's stream.
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(tensor.device().index()));
  ready.block(state_->stream);
  const auto type = NcclType(tensor.scalar_type());
  if (broadcast) {
    TY_NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type, root, state_->comm,
                                state_->stream.stream()));
  } else {
    TY_NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type, NcclOp(op),
                                state_->comm, state_->stream.stream()));
  }
  c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), state_->stream);
  return std::make_shared<NcclWork>(state_.get(), std::move(tensor), ++state_->issued, std::move(what));
}

}  // namespace trainyard
