#include "worker/kernels/packed_linear.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "worker/kernels/weight_stamp.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace trainyard {
namespace {

std::atomic<CpuGemm> cpu_gemm{CpuGemm::kAuto};

bool IntelCpu() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  return std::strcmp(vendor, "GenuineIntel") == 0;
#else
  return false;
#endif
}

bool X86Cpu() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

// mkldnn::_linear_pointwise: y = x W^T + b on a reordered (or plain) W, with no
// activation fused ("none"). Called with grad mode off or inside an autograd Function:
// the op has no autograd formula of its own.
torch::Tensor OneDnnLinear(const torch::Tensor& x, const torch::Tensor& reordered, const torch::Tensor& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                            c10::List<std::optional<c10::Scalar>>, std::optional<c10::string_view>)>();
  std::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  return op.call(x.contiguous(), reordered, b, "none", c10::List<std::optional<c10::Scalar>>(), std::nullopt);
}

// A [N, K] weight in oneDNN's blocked layout for OneDnnLinear (an MKLDNN tensor).
torch::Tensor Reorder(const torch::Tensor& weight) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                             .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  return op.call(weight.contiguous(), std::nullopt);
}

bool FloatOnCpu(const torch::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == torch::kFloat; }

}  // namespace

CpuGemm CpuGemmNamed(const std::string& name) {
  if (name == "auto") return CpuGemm::kAuto;
  if (name == "mkl") return CpuGemm::kMkl;
  if (name == "onednn") return CpuGemm::kOneDnn;
  throw std::invalid_argument("cpu_gemm '" + name + "': expected auto, mkl or onednn");
}

void SetCpuGemm(CpuGemm choice) { cpu_gemm.store(choice); }

bool OneDnnLinearInUse() {
  static const bool can = at::hasMKLDNN();
  static const bool auto_choice = X86Cpu() && !IntelCpu();
  switch (cpu_gemm.load()) {
    case CpuGemm::kMkl:
      return false;
    case CpuGemm::kOneDnn:
      return can;
    case CpuGemm::kAuto:
      break;
  }
  return can && auto_choice;
}

std::string CpuGemmInUseName() { return OneDnnLinearInUse() ? "onednn" : "mkl"; }

namespace {

struct ReorderedWeight {
  torch::Tensor forward;   // W [N, K], reordered: y = x W^T
  torch::Tensor backward;  // W^T [K, N], reordered: dL/dx = dL/dy W; undefined until wanted
  torch::Tensor bias;      // [N], or undefined
};

// y = x W^T + b with dL/dx = dL/dy W (through the reordered W^T); the weight and bias
// get no gradient (PackedLinear::Applies() admits only frozen ones).
class PackedLinearFunction : public torch::autograd::Function<PackedLinearFunction> {
 public:
  // `reorders` is not a tensor argument, so autograd tracks x alone (and an undefined
  // bias needs no special case).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const ReorderedWeight& reorders) {
    ctx->saved_data["backward_weight"] = reorders.backward;
    return OneDnnLinear(x, reorders.forward, reorders.bias);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::Tensor backward_weight = ctx->saved_data["backward_weight"].toTensor();
    return {OneDnnLinear(grads[0], backward_weight, {}), torch::Tensor()};
  }
};

}  // namespace

struct PackedLinear::Reorders : ReorderedWeight {
  std::vector<WeightStamp> stamps;    // of the weights and biases they were made from
  std::vector<c10::Storage> sources;  // theirs, kept alive (weight_stamp.h)
};

bool PackedLinear::Applies(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                           c10::ArrayRef<torch::Tensor> biases) {
  if (!OneDnnLinearInUse() || !x.defined() || x.dim() < 1 || x.numel() == 0 || !FloatOnCpu(x)) return false;
  if (weights.empty() || biases.size() != weights.size()) return false;
  for (const auto& w : weights)
    if (!w.defined() || w.dim() != 2 || !FloatOnCpu(w) || w.requires_grad()) return false;
  for (const auto& b : biases)
    if (b.defined() && (!FloatOnCpu(b) || b.requires_grad())) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;
  return !torch::jit::tracer::isTracing();
}

std::shared_ptr<const PackedLinear::Reorders> PackedLinear::Current(c10::ArrayRef<torch::Tensor> weights,
                                                                    c10::ArrayRef<torch::Tensor> biases,
                                                                    bool for_backward) {
  std::vector<WeightStamp> stamps = StampsOf(weights, biases);
  std::lock_guard<std::mutex> lock(mutex_);
  if (reorders_ && reorders_->stamps == stamps && (!for_backward || reorders_->backward.defined())) return reorders_;
  // Made outside autograd and outside inference mode: plain tensors that a later
  // training pass may hold in its graph.
  c10::InferenceMode not_inference(false);
  torch::NoGradGuard no_grad;
  // Either new reorders for changed weights, or the current ones with the backward
  // reorder added.
  const bool fresh = !reorders_ || !(reorders_->stamps == stamps);
  auto made = fresh ? std::make_shared<Reorders>() : std::make_shared<Reorders>(*reorders_);
  const torch::Tensor weight = Concatenated(weights);
  if (fresh) {
    made->stamps = std::move(stamps);
    made->sources = SourcesOf(weights, biases);
    made->forward = Reorder(weight);
    if (biases[0].defined()) made->bias = Concatenated(biases).contiguous();  // Forward(): all or none
  }
  if (for_backward) made->backward = Reorder(weight.t());
  reorders_ = made;
  return made;
}

torch::Tensor PackedLinear::Forward(const torch::Tensor& x, c10::ArrayRef<torch::Tensor> weights,
                                    c10::ArrayRef<torch::Tensor> biases) {
  for (const auto& b : biases)
    TORCH_CHECK(b.defined() == biases[0].defined(), "PackedLinear: a bias for every weight, or for none");
  const bool wants_grad = torch::GradMode::is_enabled() && x.requires_grad();
  const std::shared_ptr<const Reorders> reorders = Current(weights, biases, wants_grad);
  TORCH_CHECK(x.size(-1) == reorders->forward.size(1), "PackedLinear: x has ", x.size(-1), " columns, the weight ",
              reorders->forward.size(1));
  if (!wants_grad) return OneDnnLinear(x, reorders->forward, reorders->bias);
  return PackedLinearFunction::apply(x, static_cast<const ReorderedWeight&>(*reorders));
}

}  // namespace trainyard
