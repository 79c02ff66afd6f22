// Whole training steps replayed from CUDA graphs (train.cuda_graph).
//
// How it works. A training step on a GPU is hundreds of small kernels, and at
// BERT-base's sizes the host cannot launch them as fast as the device runs them. A CUDA
// graph launches them all at once. The step is the trainer's own step function, with
// no host decision inside it (the loss scaler, the inf check, clipping and the fused
// AdamW all run on the device; see GradScaler), captured whole: forward, backward, the
// gradient all-reduce (NCCL's kernels are captured like any other), unscaling and the
// ranks' agreement on found_inf, clipping, the optimizer and the scaler's update.
//
// A graph replays fixed shapes at fixed addresses, so there is one graph per batch
// shape (rows, padded length), all drawing on one memory pool (the shapes' activations
// share it, since only one replays at a time), and each has static input tensors the
// batch is copied into. The data pipeline pads lengths to a few values
// (data.pad_buckets, PadBucketLengths) so that the shapes, and graphs, stay few. What
// changes from step to step besides the batch (learning rate, loss weight, stop vote,
// debug inf) is copied into small static tensors the graph reads.
//
// Evaluation passes are graphed too, one graph per shape in the same pool: a pass has
// no side effects, so it is warmed up and captured on its shape's first batch.
//
// A step is never run twice: the first time a shape is seen its step runs eagerly on
// the capture stream (lazy initialisation, cuBLAS workspaces and the allocator's first
// blocks stay out of the graph); the second time it is captured, which runs nothing,
// and then replayed, which runs it; after that it is replayed. So a graphed run makes
// the same steps as an eager one, on the same weights. Capturing fails on an operation
// that waits for the host (an .item(), a nonzero()); the error names the shape.
//
// REQUIRES: one thread drives the steps, and the model, the optimizer, the scaler and
// the reducer keep their tensors (weights, moments, buckets) at fixed addresses.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "worker/train/batch_pipeline.h"

namespace trainyard {

// What varies between steps besides the batch. Eager steps read the host values; a
// graphed step reads the `device` tensors (float [1] each), which Run() fills first.
struct StepControls {
  double lr = 0, loss_weight = 1;
  bool stop_vote = false, plant_inf = false;
  struct OnDevice {
    torch::Tensor lr, loss_weight, stop_vote, plant_inf;
  } device;
  bool graphed() const { return device.lr.defined(); }
};

// What a step leaves on the device: its (unscaled) loss and, under loss scaling, its
// found_inf flag (undefined otherwise).
struct StepResult {
  torch::Tensor loss, found_inf;
};

class GraphedSteps {
 public:
  using Step = std::function<StepResult(Batch& batch, const StepControls& controls)>;

  // Throws std::runtime_error off CUDA, or in a build without CUDA.
  explicit GraphedSteps(torch::Device device);
  ~GraphedSteps();
  GraphedSteps(const GraphedSteps&) = delete;
  GraphedSteps& operator=(const GraphedSteps&) = delete;

  // Runs `step` on `batch` (already on the device) through its shape's graph, as the
  // header describes. The result's tensors are the caller's own (copies of the graph's
  // outputs). Collective where `step` is: every rank must call it at the same steps.
  StepResult Run(Batch& batch, const StepControls& controls, const Step& step);

  // Evaluation: `pass` (the batch's contribution to the evaluation sums, without side
  // effects) replayed from its shape's graph, captured on the shape's first batch after
  // warm-up calls (CaptureCudaGraph). Returns a copy of the pass's output.
  using Pass = std::function<torch::Tensor(Batch& batch)>;
  torch::Tensor Evaluate(Batch& batch, const Pass& pass);

  // Runs `fn` with the stream the steps are captured on current. Autograd nodes made
  // in it record that stream, and a node kept across steps must: the reducer's
  // AccumulateGrad nodes, made on another stream, would make the captured backward
  // wait on that stream, which a capture refuses (cudaErrorStreamCaptureImplicit).
  void OnStepStream(const std::function<void()>& fn);

  // Training graphs captured so far (one per batch shape seen twice).
  size_t graphs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard
