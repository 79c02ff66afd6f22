// Frozen linear weights cast to autocast's compute dtype once, not on every pass.
//
// Why: under autocast (bf16 or fp16) every product casts its fp32 weight and bias to
// the compute dtype on each call, and the q/k/v projections concatenate their three
// weights first. For a model that only infers, or the frozen base weights under LoRA,
// those casts redo the same work each pass: in a CUDA graph of bert-base at batch 1
// they are over a hundred of the replay's kernels, and they read and write more bytes
// than the products themselves.
//
// A frozen weight set (every weight and bias fp32, requires_grad false: see model.h's
// Freeze()) is concatenated and cast once into a copy kept beside the parameters; the
// copy is made again when a parameter's storage, shape or version counter changes (a
// load, a merge; weight_stamp.h). One copy is kept per compute dtype, so bf16 and fp16
// passes over the same model (a benchmark's cells) do not remake each other's.
//
// The product is the same ATen call on the same values as autocast's own path: autocast
// casts x as before and finds the weight already in its dtype, so the result is the
// same to the bit. Weights that require grad never take this path: an optimizer may
// write them in place without moving their version counter.
//
// CUDA graphs: a graph captured over a pass through these copies replays the copies,
// not the fp32 parameters. So copies are never made during a capture (a capture that
// finds none current runs autocast's own casts, which the graph then holds), and the
// weights must not change while such a graph is alive: it would go on reading the
// copies of the old values. Capture after a warm-up pass (CaptureCudaGraph does) to
// get the copies into the graph. Memory: one more copy of each frozen weight, at half
// its size.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace trainyard {

// Whether Applies() below may say yes: one process-wide setting (a job's
// runtime.weight_casts: once), on by default. Thread-safe; meant for a job's setup,
// before any forward pass. Off, autocast casts the weights on every pass, and only the
// fp32 weights take memory.
void SetWeightCastsOnce(bool on);
bool WeightCastsOnce();

class ComputeDtypeWeights {
 public:
  ComputeDtypeWeights() = default;
  // A copy starts empty: cached copies belong to the parameters they were made from.
  ComputeDtypeWeights(const ComputeDtypeWeights&) {}
  // Assignment keeps this object's own copies: it copies nothing, so self-assignment is safe.
  ComputeDtypeWeights& operator=(const ComputeDtypeWeights&) {
    return *this;
  }  // NOLINT(bugprone-unhandled-self-assignment)

  // Whether a product of x with `weights` (one bias per weight, all defined or none)
  // may use cast copies: WeightCastsOnce(); autocast is on for x's device type with bf16 or fp16; every
  // weight 2-D, and every weight and defined bias fp32, on x's device and frozen; no JIT
  // trace (which must record ATen's ops). x may want a gradient.
  static bool Applies(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                      c10::ArrayRef<torch::Tensor> biases);

  // The concatenation along dim 0 of `weights` and of `biases` (undefined for no bias)
  // in autocast's compute dtype, made now if missing or stale. A single weight keeps its
  // layout: the copy of a transposed view is a transposed view. Returns undefined
  // tensors, and makes nothing, during a CUDA graph capture when no copy is current.
  // REQUIRES: Applies(x, weights, biases) for some x on the weights' device.
  struct Copies {
    torch::Tensor weight, bias;
  };
  Copies Current(c10::ArrayRef<torch::Tensor> weights, c10::ArrayRef<torch::Tensor> biases);

  // torch::linear(x, W, b) for W and b the concatenations of `weights` and `biases`,
  // through the cast copies: autocast's result, bit for bit. REQUIRES: Applies(x,
  // weights, biases).
  torch::Tensor Forward(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                        c10::ArrayRef<torch::Tensor> biases);

  // How many times copies were made (for tests).
  int64_t copies_made() const;

 private:
  struct Cast;
  std::shared_ptr<const Cast> Make(c10::ArrayRef<torch::Tensor> weights, c10::ArrayRef<torch::Tensor> biases,
                                   at::ScalarType dtype);

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const Cast>> casts_;  // one per compute dtype; each immutable once published
  int64_t copies_made_ = 0;
};

}  // namespace trainyard
