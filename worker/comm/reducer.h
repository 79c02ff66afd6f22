// Data-parallel gradient averaging, bucketed and overlapped with backward.
//
// How it works. Parameters are grouped into buckets of about `bucket_bytes`, in
// reverse registration order, because backward produces gradients roughly from the
// last layer to the first. Each bucket owns one flat buffer. A hook on every
// parameter fires when autograd has that parameter's gradient for this step; the hook
// copies the gradient into its bucket's buffer, and when the last gradient of a bucket
// arrives the bucket is all-reduced at once, on the comm thread, while backward goes
// on computing the earlier layers. Buckets are launched strictly in index order, so
// every rank issues the same collectives in the same order even if gradients arrive
// in a different order. After backward, FinishBackward() launches what is left,
// waits (this wait is the "exposed" communication that backward did not hide),
// divides by the number of ranks and writes the averages into each .grad.
// With overlap off, every bucket is launched after backward instead, for comparison.
// With fp16 compression the buffers travel as fp16 and are summed in fp32 chunks.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace trainyard {

struct ReducerOptions {
  int64_t bucket_bytes = 25 << 20;
  bool overlap = true;
  bool fp16_compression = false;
};

class Reducer {
 public:
  // Registers a gradient hook on each parameter. `params` and `comm` must outlive it.
  Reducer(std::vector<std::pair<std::string, torch::Tensor>> params, Communicator& comm,
          ReducerOptions options);

  // Call before each backward pass.
  void PrepareForBackward();
  // For a rank with no examples in this step: contributes zero gradients.
  void ContributeZeros();
  // Call after backward. Returns the milliseconds spent waiting for communication.
  double FinishBackward();

  size_t num_buckets() const { return buckets_.size(); }
  // "bucket i: n params, m MB" lines, for the log.
  std::string Describe() const;

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    torch::Tensor buffer, wire;
    size_t pending = 0;
    bool launched = false;
    std::shared_ptr<Work> work;
  };

  void OnGradient(size_t param, const torch::Tensor& grad);
  void LaunchReady(bool force);

  std::vector<torch::Tensor> params_;
  std::vector<std::pair<size_t, size_t>> slot_of_;  // param -> (bucket, index in bucket)
  std::vector<Bucket> buckets_;
  Communicator& comm_;
  ReducerOptions options_;
  size_t next_to_launch_ = 0;
  int64_t step_ = 0;
};

}  // namespace trainyard
