#include "worker/kernels/fused_bias_gelu.h"

#include <cstdint>

#ifdef TRAINYARD_WITH_CUDA
#include "worker/kernels/fused_bias_gelu_cuda.h"
#endif

namespace trainyard {

#ifdef TRAINYARD_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// t contiguous, with its data aligned for the kernels' 4-wide loads (a view into the
// middle of a buffer may not be: it is copied).
torch::Tensor ContiguousAligned(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  const auto alignment = static_cast<uintptr_t>(4 * c.element_size());
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % alignment == 0 ? c : c.clone();
}

// Saves x and the bias: the backward evaluates GELU's derivative at x + bias again.
class FusedBiasGeluFunction : public torch::autograd::Function<FusedBiasGeluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& bias) {
    const torch::Tensor x_in = ContiguousAligned(x), bias_in = ContiguousAligned(bias);
    ctx->save_for_backward({x_in, bias_in});
    return cuda::BiasGeluForward(x_in, bias_in);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor dy = ContiguousAligned(grads[0].to(saved[0].scalar_type()));
    cuda::BiasGeluGrads g = cuda::BiasGeluBackward(dy, saved[0], saved[1], ctx->needs_input_grad(1));
    return {g.dx, g.dbias};
  }
};

}  // namespace
#endif

bool FusedBiasGeluApplies(const torch::Tensor& x, const torch::Tensor& bias) {
#ifdef TRAINYARD_WITH_CUDA
  if (!x.defined() || !bias.defined() || !x.is_cuda() || x.dim() < 1 || bias.device() != x.device()) return false;
  const auto xt = x.scalar_type();
  if (xt != torch::kFloat && xt != torch::kBFloat16 && xt != torch::kHalf) return false;
  const int64_t cols = x.size(-1);
  if (bias.scalar_type() != torch::kFloat || bias.dim() != 1 || bias.size(0) != cols) return false;
  return cuda::BiasGeluFits(cols);
#else
  (void)x, (void)bias;
  return false;
#endif
}

torch::Tensor FusedBiasGelu(const torch::Tensor& x, const torch::Tensor& bias) {
#ifdef TRAINYARD_WITH_CUDA
  if (FusedBiasGeluApplies(x, bias)) return FusedBiasGeluFunction::apply(x, bias);
#endif
  // The bias in x's dtype, as a product's own bias epilogue adds it under autocast.
  return torch::gelu(x + bias.to(x.scalar_type()));
}

}  // namespace trainyard
