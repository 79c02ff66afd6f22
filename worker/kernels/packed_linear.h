// Linear products on the CPU through oneDNN, on weights reordered once.
//
// Why: ATen's fp32 linear on the CPU calls MKL's sgemm, which repacks the weight into
// its blocked layout on every call and which, on x86 CPUs not made by Intel, runs a
// generic code path. oneDNN's inner product (the `mkldnn::_linear_pointwise` op that
// libtorch registers, and that torch.compile's CPU backend uses for frozen weights)
// runs its own AVX-512/AVX2 kernels on any x86 CPU, on a weight reordered ahead of time
// into its blocked layout (`mkldnn::_reorder_linear_weight`). On this project's AMD
// Zen 4 machine it takes 0.81-0.95x MKL's time on most of BERT's products
// (scripts/bench/cpu_gemm.sh prints both for a model's shapes).
//
// A frozen weight (requires_grad false: a model that only infers, see model.h's
// Freeze(), and the base weights under LoRA) is reordered once and kept beside the
// parameter, in a PackedLinear; the reorder is made again when the parameter's storage
// or version counter changes (a load, a merge). A weight that requires grad never
// takes this path, not even under no_grad: an optimizer may write it in place without
// moving its version counter (ours does, through raw pointers), which would leave a
// reorder stale without a trace. Memory: one more copy of each frozen weight, two when
// gradients flow through it.
//
// Gradients go to x only: dL/dx = dL/dy · W is a product with W^T, which is reordered
// too, the first time a gradient to x is wanted.
//
// Which library runs (runtime.cpu_gemm) is one process-wide setting: mkl (ATen's path),
// onednn, or auto: oneDNN on x86 CPUs other than Intel's, where MKL's fast paths are
// not taken, and ATen's path elsewhere. auto is a fixed rule rather than a timing
// probe, so that a job computes the same bits in every run and on every rank of one
// kind of machine.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>

namespace trainyard {

enum class CpuGemm { kAuto, kMkl, kOneDnn };
// "auto", "mkl", "onednn". Throws std::invalid_argument naming the choices.
CpuGemm CpuGemmNamed(const std::string& name);
// Process-wide; the default is kAuto. Thread-safe; meant for a job's setup, before any
// forward pass.
void SetCpuGemm(CpuGemm choice);
// Whether the products PackedLinear::Applies() accepts run on oneDNN: the setting with
// auto resolved; false where this libtorch was built without oneDNN.
bool OneDnnLinearInUse();
// "onednn" or "mkl": what OneDnnLinearInUse() says, for logs.
std::string CpuGemmInUseName();

// The oneDNN reorders of one linear weight, made on first use and remade when the
// weight changes. Thread-safe: concurrent forward passes share the reorders.
class PackedLinear {
 public:
  PackedLinear() = default;
  // A copy starts empty: reorders belong to the parameters they were made from.
  PackedLinear(const PackedLinear&) {}
  // Assignment keeps this object's own reorders: it copies nothing, so self-assignment is safe.
  PackedLinear& operator=(const PackedLinear&) { return *this; }  // NOLINT(bugprone-unhandled-self-assignment)

  // Whether x times the weight made of `weights` (see Forward) may run here:
  // OneDnnLinearInUse(); x, every weight and every defined bias fp32 on the CPU; the
  // weights and biases frozen (requires_grad false; x may want a gradient); no CPU
  // autocast (which would run the product in bf16); no JIT trace (which must record
  // ATen ops).
  static bool Applies(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                      c10::ArrayRef<torch::Tensor> biases);

  // x [..., K] @ W^T + b, where W [N, K] is the concatenation along dim 0 of `weights`
  // (each [N_i, K]; a transposed view is fine) and b that of `biases`, one per weight,
  // all undefined for no bias. Differentiable in x. REQUIRES: Applies(x, weights, biases),
  // and the same number of weights with the same shapes on every call.
  torch::Tensor Forward(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                        c10::ArrayRef<torch::Tensor> biases);

 private:
  struct Reorders;
  // The reorders of these weights and biases, made (or remade, or completed with the
  // backward one) under mutex_ when missing or stale.
  std::shared_ptr<const Reorders> Current(c10::ArrayRef<torch::Tensor> weights, c10::ArrayRef<torch::Tensor> biases,
                                          bool for_backward);

  std::mutex mutex_;
  std::shared_ptr<const Reorders> reorders_;  // immutable once published; replaced whole
};

}  // namespace trainyard
