#include "worker/kernels/fused_add_norm.h"

#include <optional>
#include <stdexcept>
#include <utility>

#ifdef TRAINYARD_WITH_CUDA
#include "worker/kernels/fused_add_norm_cuda.h"
#endif

namespace trainyard {

#ifdef TRAINYARD_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Saves the fp32 sum, the row statistics and the keep mask; the backward normalises the
// sum again rather than keep the normalised values too. x_bias may be absent (no bias,
// and no gradient for it). It is an optional, not an undefined tensor, because
// Function::apply records every tensor argument's device and dtype, which an undefined
// tensor does not have; an empty optional is recorded as no input at all.
class FusedAddNormFunction : public torch::autograd::Function<FusedAddNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const std::optional<torch::Tensor>& x_bias,
                               const torch::Tensor& residual, const torch::Tensor& weight, const torch::Tensor& bias,
                               double eps, double p) {
    const bool has_x_bias = x_bias.has_value() && x_bias->defined();
    const torch::Tensor x_bias_in = has_x_bias ? x_bias->contiguous() : torch::Tensor();
    cuda::AddNormForwardResult r = cuda::AddNormForward(x.contiguous(), x_bias_in, residual.contiguous(),
                                                        weight.contiguous(), bias.contiguous(), eps, p);
    ctx->save_for_backward({r.sum, weight, r.mean, r.rstd, r.keep});
    ctx->saved_data["p"] = p;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_bias"] = has_x_bias;
    // Autograd wants defined outputs: without dropout the mask is empty.
    torch::Tensor keep = r.keep.defined() ? r.keep : torch::empty({0}, x.options().dtype(torch::kByte));
    ctx->mark_non_differentiable({keep});
    return {r.y, keep};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const auto x_type = static_cast<torch::ScalarType>(ctx->saved_data["x_type"].toInt());
    cuda::AddNormGrads g =
        cuda::AddNormBackward(grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3], saved[4],
                              ctx->saved_data["p"].toDouble(), x_type, ctx->saved_data["x_bias"].toBool());
    return {g.dx, g.dx_bias, g.dresidual, g.dweight, g.dbias, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace
#endif

bool FusedAddNormApplies(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                         const torch::Tensor& bias, const torch::Tensor& x_bias) {
#ifdef TRAINYARD_WITH_CUDA
  if (!x.defined() || !residual.defined() || !weight.defined() || !bias.defined()) return false;
  if (!x.is_cuda() || x.dim() < 1 || x.sizes() != residual.sizes()) return false;
  if (residual.device() != x.device() || weight.device() != x.device() || bias.device() != x.device()) return false;
  const auto xt = x.scalar_type();
  if (xt != torch::kFloat && xt != torch::kBFloat16 && xt != torch::kHalf) return false;
  if (residual.scalar_type() != torch::kFloat && residual.scalar_type() != xt) return false;
  const int64_t hidden = x.size(-1);
  if (x_bias.defined() && x_bias.device() != x.device()) return false;
  for (const torch::Tensor* t : {&weight, &bias, &x_bias})
    if (t->defined() && (t->scalar_type() != torch::kFloat || t->dim() != 1 || t->size(0) != hidden)) return false;
  return cuda::AddNormFits(hidden);
#else
  (void)x, (void)residual, (void)weight, (void)bias, (void)x_bias;
  return false;
#endif
}

torch::Tensor FusedDropoutAddNorm(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                                  const torch::Tensor& bias, double eps, double p, bool training,
                                  const torch::Tensor& x_bias) {
  if (FusedAddNormApplies(x, residual, weight, bias, x_bias))
    return FusedDropoutAddNormWithMask(x, residual, weight, bias, eps, p, training, x_bias).first;
  // The bias in x's dtype, as a product's own bias epilogue adds it under autocast.
  const torch::Tensor biased = x_bias.defined() ? x + x_bias.to(x.scalar_type()) : x;
  torch::Tensor dropped = training && p > 0 ? torch::dropout(biased, p, true) : biased;
  return torch::layer_norm(dropped + residual, {x.size(-1)}, weight, bias, eps);
}

std::pair<torch::Tensor, torch::Tensor> FusedDropoutAddNormWithMask(const torch::Tensor& x,
                                                                    const torch::Tensor& residual,
                                                                    const torch::Tensor& weight,
                                                                    const torch::Tensor& bias, double eps, double p,
                                                                    bool training, const torch::Tensor& x_bias) {
  if (!FusedAddNormApplies(x, residual, weight, bias, x_bias))
    throw std::invalid_argument("FusedDropoutAddNormWithMask: these tensors do not fit the fused kernels");
#ifdef TRAINYARD_WITH_CUDA
  const double drop = training ? p : 0.0;
  const std::optional<torch::Tensor> x_bias_arg = x_bias.defined() ? std::optional(x_bias) : std::nullopt;
  variable_list out = FusedAddNormFunction::apply(x, x_bias_arg, residual, weight, bias, eps, drop);
  return {out[0], drop > 0 ? out[1] : torch::Tensor()};
#else
  return {};
#endif
}

}  // namespace trainyard
