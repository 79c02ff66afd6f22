// Moves host batches to the training device. On CUDA the copies are issued
// non-blocking from pinned memory on a side stream, and the compute stream waits on an
// event, so the copy of batch n+1 can overlap the tail of step n's compute.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "worker/train/batch_pipeline.h"

namespace trainyard {

class DeviceTransfer {
 public:
  explicit DeviceTransfer(torch::Device device);
  ~DeviceTransfer();
  // Returns the batch on the device; on CUDA, ordered before later work on the
  // current stream. The host tensors may be dropped at once: they are pinned, and the
  // caching host allocator does not reuse their memory until the copy has run.
  Batch ToDevice(Batch host);

 private:
  struct CudaState;
  torch::Device device_;
  std::unique_ptr<CudaState> cuda_;
};

}  // namespace trainyard
