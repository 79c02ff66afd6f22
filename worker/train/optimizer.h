// AdamW with decoupled weight decay (Loshchilov & Hutter), the update torch.optim.AdamW
// makes, and the linear warm-up/decay learning-rate schedule.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace trainyard {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// The update runs as ATen's fused AdamW kernel (`_fused_adamw_`, what torch.optim.AdamW
// does with fused=True): one pass over each parameter and its two moments, where the
// same update in per-tensor operators (decay, lerp, addcmul, sqrt, div, add, addcdiv)
// walked every tensor seven times and took ~15% of a tiny BERT's CPU step (profiled
// with log.profile_steps). It is called once per weight-decay group.
//
// Master weights. A parameter stored in a lower precision than fp32 (train.bf16_weights
// keeps the linear layers' weights in bf16) is trained through an fp32 master copy
// that this optimizer owns: TakeGradients() copies the parameters' gradients into the
// masters' (one foreach copy), clipping and the fused kernel work on the masters, and
// Step() ends by copying the masters back into the parameters (one more). Rounding to
// bf16 then happens once per step, on the weights the forward reads, while the small
// updates accumulate in fp32. No step waits for the host, so a CUDA graph holds it.
class AdamW {
 public:
  // Decay applies to matrices and embeddings only (dim >= 2), not to biases or
  // LayerNorm weights, as in Hugging Face's Trainer. `params` must outlive this, and
  // must all be on one device. Parameters not in fp32 get fp32 masters (above).
  AdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, AdamWOptions options);

  // The tensors whose gradients the update reads, in the constructor's order: each
  // parameter's master where it has one, else the parameter. After TakeGradients(),
  // clip these (ClipGradNorm). Their addresses stay fixed.
  const std::vector<torch::Tensor>& updated() const { return updated_; }
  // Copies the gradients of the parameters with masters into the masters' gradients (a
  // parameter without a gradient leaves its master without one). Call after backward
  // and the all-reduce; Step() calls it itself where it was not called since the last
  // ZeroGrad(). A no-op without masters.
  void TakeGradients();

  // One update at learning rate `lr`. With `found_inf` (a one-element float tensor on
  // the parameters' device, as GradScaler::UnscaleAndCheck returns) the kernel leaves
  // parameters and moments alone where it is nonzero, and the step count stays, as
  // torch's fused AdamW does under a GradScaler: a skipped step needs no host decision.
  void Step(double lr, const torch::Tensor& found_inf = {});
  // The same with the rate in a one-element float tensor on the parameters' device, so a
  // CUDA graph that holds the step replays it at whatever rate the tensor holds then.
  void Step(const torch::Tensor& lr, const torch::Tensor& found_inf = {});
  void ZeroGrad();
  // Updates made (skipped ones not counted). Read from the device: a wait on CUDA.
  int64_t step_count() const;

  // State for checkpoints: "exp_avg.<name>", "exp_avg_sq.<name>", and "master.<name>"
  // for the parameters with masters.
  std::vector<std::pair<std::string, torch::Tensor>> StateTensors() const;
  // Throws std::runtime_error if a tensor is missing or mis-shaped. Restored masters
  // are copied into their parameters.
  void RestoreState(const std::map<std::string, torch::Tensor>& tensors, int64_t step_count);

  // Writes each master into its parameter's place as an fp32 tensor (the parameter
  // leaves its lower precision for good), so that what is saved afterwards holds the
  // trained fp32 weights. For the end of training: no Step() may follow.
  void ReleaseMasters();

 private:
  struct Slot {
    std::string name;
    torch::Tensor param, exp_avg, exp_avg_sq;
    bool decay;
    // Where param is not fp32: its fp32 copy, which the kernel updates, and the fp32
    // buffer its gradient is copied into (kept, so its address stays fixed).
    torch::Tensor master, master_grad;
    const torch::Tensor& updated() const { return master.defined() ? master : param; }
  };
  // Counts the step on the device and runs the fused kernel once per weight-decay group.
  template <typename Lr>
  void StepWith(const Lr& lr, const torch::Tensor& found_inf);
  void CopyMastersBack();

  std::vector<Slot> slots_;
  std::vector<torch::Tensor> updated_;  // Slot::updated() of each slot
  bool has_masters_ = false, gradients_taken_ = false;
  torch::Tensor step_;  // float scalar on the parameters' device: the kernel's step count
  AdamWOptions options_;
};

// Scales the gradients so that their joint L2 norm is at most `max_norm`, with the
// arithmetic of torch.nn.utils.clip_grad_norm_ (same results, bit for bit), but without
// reading the norm back to the host, so a GPU step does not wait for it.
void ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace trainyard
