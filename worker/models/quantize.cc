#include "worker/models/quantize.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>
#include <stdexcept>

#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace trainyard {
namespace {

// The ops are registered by libtorch_cpu; a boxed call keeps the packed-weights class
// (LinearPackedParamsBase) opaque here.
const c10::OperatorHandle& Op(const char* name) {
  static const c10::OperatorHandle& prepack =
      c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "");
  static const c10::OperatorHandle& dynamic =
      c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic", "");
  return std::string(name) == "prepack" ? prepack : dynamic;
}

}  // namespace

c10::IValue PackInt8Linear(const torch::Tensor& weight, const torch::Tensor& bias) {
  torch::NoGradGuard no_grad;
  const torch::Tensor w = weight.detach().to(torch::kFloat).contiguous();
  // MinMaxObserver, per_tensor_symmetric, qint8 [-128, 127]: scale = max|w| / 127.5,
  // computed in float32 as the observer does, so both round the weights alike.
  const torch::Tensor amax = torch::max(-torch::clamp_max(w.min(), 0), torch::clamp_min(w.max(), 0));
  const double scale = torch::clamp_min(amax / 127.5, double(std::numeric_limits<float>::epsilon())).item<float>();
  torch::Tensor q = at::quantize_per_tensor(w, scale, 0, torch::kQInt8);
  torch::jit::Stack stack{q,
                          bias.defined() ? c10::IValue(bias.detach().to(torch::kFloat).contiguous()) : c10::IValue()};
  Op("prepack").callBoxed(&stack);
  return stack.at(0);
}

torch::Tensor Int8Linear(const torch::Tensor& x, const c10::IValue& packed) {
  // reduce_range: inputs quantized to 7 bits, as torch's dynamic Linear does (its
  // module version 4), which keeps FBGEMM's int16 accumulation of uint8 x int8 pairs
  // from saturating.
  torch::jit::Stack stack{x.to(torch::kFloat).contiguous(), packed, /*reduce_range=*/true};
  Op("dynamic").callBoxed(&stack);
  return stack.at(0).toTensor();
}

Int8Summary QuantizeLinearsInt8(torch::nn::Module& model) {
  Int8Summary summary;
  auto count = [&](const torch::Tensor& w) {
    summary.layers += 1;
    summary.fp32_mb += double(w.numel()) * 4.0 / 1048576.0;
    summary.int8_mb += double(w.numel()) / 1048576.0;
  };
  // An input's quantization range is its min/max over the whole tensor, padding rows
  // included, as torch's module sees it; packed tokens would change that range.
  // For the same reason the last layer keeps every row (ModelImpl::head_rows()).
  if (auto* family_model = dynamic_cast<ModelImpl*>(&model)) {
    family_model->set_unpadding(Unpadding::kNever);
    family_model->set_head_rows_only(false);
  }
  for (const auto& module : model.modules(/*include_self=*/true)) {
    if (auto* linear = module->as<AdaptableLinear>()) {
      if (!linear->weight.device().is_cpu())
        throw std::invalid_argument("int8 quantization runs on the CPU; the model is on " +
                                    linear->weight.device().str());
      linear->int8_weight = PackInt8Linear(linear->weight, linear->bias);
      count(linear->weight);
    } else if (auto* conv = module->as<Conv1D>()) {
      if (!conv->weight.device().is_cpu())
        throw std::invalid_argument("int8 quantization runs on the CPU; the model is on " +
                                    conv->weight.device().str());
      conv->int8_weight = PackInt8Linear(conv->weight.t(), conv->bias);  // stored [in, out]
      count(conv->weight);
    }
  }
  return summary;
}

}  // namespace trainyard
