#include "worker/train/device_transfer.h"

#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainyard {

#ifdef TRAINYARD_WITH_CUDA
struct DeviceTransfer::CudaState {
  c10::cuda::CUDAStream copy_stream;
};
#else
struct DeviceTransfer::CudaState {};
#endif

DeviceTransfer::DeviceTransfer(torch::Device device) : device_(device) {
#ifdef TRAINYARD_WITH_CUDA
  if (device_.is_cuda())
    cuda_.reset(new CudaState{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index())});
#endif
}

DeviceTransfer::~DeviceTransfer() = default;

Batch DeviceTransfer::ToDevice(Batch host) {
  if (device_.is_cpu()) return host;
#ifdef TRAINYARD_WITH_CUDA
  if (cuda_) {
    c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    Batch out;
    {
      c10::cuda::CUDAStreamGuard on_copy_stream(cuda_->copy_stream);
      out.input_ids = host.input_ids.to(device_, /*non_blocking=*/true);
      out.attention_mask = host.attention_mask.to(device_, true);
      out.labels = host.labels.to(device_, true);
      out.packing = host.packing.To(device_, true);
    }
    at::cuda::CUDAEvent copied;
    copied.record(cuda_->copy_stream);
    copied.block(compute);
    // The caching allocator must not reuse the device blocks before the compute
    // stream is done with them.
    for (auto* t : {&out.input_ids, &out.attention_mask, &out.labels, &out.packing.index, &out.packing.starts})
      if (t->defined()) c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), compute);
    out.real_tokens = host.real_tokens;
    return out;
  }
#endif
  Batch out = host;
  out.input_ids = host.input_ids.to(device_);
  out.attention_mask = host.attention_mask.to(device_);
  out.labels = host.labels.to(device_);
  out.packing = host.packing.To(device_, false);
  return out;
}

}  // namespace trainyard
