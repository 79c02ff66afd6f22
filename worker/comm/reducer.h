// Data-parallel gradient averaging, bucketed and overlapped with backward.
//
// How it works. Parameters are grouped into buckets of about `bucket_bytes`, in
// reverse registration order, because backward produces gradients roughly from the
// last layer to the first. Each bucket owns one flat buffer, and every parameter's
// .grad is a view into its bucket's buffer (PyTorch DDP's gradient_as_bucket_view):
// PrepareForBackward() zeroes the buffers, so autograd accumulates each gradient
// straight into the bucket and nothing is copied in or out. A hook that runs after
// each parameter's gradient has been accumulated counts the bucket's pending
// gradients down; when the last one arrives the bucket is all-reduced at once while
// backward goes on computing the earlier layers. Buckets are launched strictly in
// index order, so every rank issues the same collectives in the same order even if
// gradients arrive in a different order. FinishBackward() launches what is left, waits
// (this wait is the "exposed" communication that backward did not hide) and divides
// each buffer by the number of ranks, in place: the views then hold the averages.
// With overlap off, every bucket is launched after backward instead, for comparison.
// With fp16 compression the buffers travel as fp16 and are summed in fp32 chunks.
// A bucket holds gradients of one dtype: with bf16 weights (train.bf16_weights) the
// linear layers' gradients fill bf16 buckets and the others fp32 ones, each dtype's
// buckets filled in the same reverse order.
//
// Gradient accumulation: between PrepareForBackward() and FinishBackward() a step may
// run several backward passes, one per micro-batch. While set_accumulating(true), the
// hooks let the gradients add up in the buckets and count nothing; the last micro-batch's
// backward runs with it false, counts each bucket down and launches it as above, once
// per step.
//
// The first bucket carries one extra value after its gradients: each rank's stop
// vote for this step (see Note [Stop agreement] in job_setup.h). It is summed with the
// gradients, so reading it costs no collective of its own.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/trace_recorder.h"
#include "worker/comm/communicator.h"

namespace trainyard {

struct ReducerOptions {
  int64_t bucket_bytes = 25 << 20;
  bool overlap = true;
  bool fp16_compression = false;
};

class Reducer {
 public:
  // Registers a hook on each parameter's gradient accumulator; the destructor removes
  // them. `comm` must outlive the Reducer; the parameters are shared, not copied.
  Reducer(const std::vector<std::pair<std::string, torch::Tensor>>& params, Communicator& comm, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before each backward pass: zeroes the buckets, points every .grad at its
  // view and records this rank's stop vote. REQUIRES: the previous step finished.
  void PrepareForBackward(bool stop_vote = false);
  // The same with the vote in a one-element tensor on the gradients' device (nonzero:
  // stop), copied on the device: a CUDA graph holding the step reads whatever it holds.
  void PrepareForBackward(const torch::Tensor& stop_vote);
  // With a recorder, each bucket's all-reduce of the steps that follow becomes a span
  // from its launch to the end of its wait in FinishBackward (its completion is known
  // no earlier), named by the global step set with set_trace_step.
  void set_trace(TraceRecorder* trace) { trace_ = trace; }
  void set_trace_step(int64_t step) { trace_step_ = step; }
  // While true, backward passes accumulate gradients without counting or launching any
  // bucket: the micro-batches before a step's last. Stays set until changed.
  void set_accumulating(bool accumulating) { accumulating_ = accumulating; }
  // For a rank with no backward in its step's last micro-batch (no examples there):
  // contributes what the buckets hold, zeros when it had no examples at all.
  void ContributeWithoutBackward();
  // Call after backward: every .grad then holds the average over the ranks (on CUDA,
  // for work queued after this call on the current stream).
  void FinishBackward();
  // After FinishBackward(): a one-element tensor on the gradients' device, > 0 when
  // any rank voted to stop in this step.
  torch::Tensor StopVotes() const;

  size_t num_buckets() const { return buckets_.size(); }
  // Of the last step run on the host (a CUDA graph's replays run none): how many buckets
  // were launched while backward was still running, from the gradient hooks, rather than
  // by FinishBackward(). Zero with overlap off; with it on, every bucket whose
  // gradients all arrived before the last one in launch order's did.
  size_t launched_in_backward() const { return launched_in_backward_; }
  // "bucket i: n params, m MB" lines, for the log.
  std::string Describe() const;

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    int64_t grad_numel = 0;  // the buffer's gradient part (the first bucket has a vote after it)
    torch::Tensor buffer, wire;
    size_t pending = 0;
    std::shared_ptr<Work> work;
    int64_t launched_us = 0;  // for the trace
  };

  void PrepareBuckets();
  torch::Tensor VoteSlot() const;
  void OnGradientAccumulated(size_t param);
  void LaunchReady(bool force);
  void Launch(Bucket& b);

  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> views_;                                  // param -> its .grad view into a bucket
  std::vector<std::pair<size_t, size_t>> slot_of_;                    // param -> (bucket, index in bucket)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive: they hold the hooks
  std::vector<uintptr_t> hook_keys_;
  std::vector<Bucket> buckets_;
  Communicator& comm_;
  ReducerOptions options_;
  size_t next_to_launch_ = 0;
  size_t launched_in_backward_ = 0;
  bool in_step_ = false;
  bool accumulating_ = false;
  int64_t step_ = 0;
  TraceRecorder* trace_ = nullptr;
  int64_t trace_step_ = 0;
};

}  // namespace trainyard
