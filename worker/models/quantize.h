// Dynamic int8 quantization of a model's Linear layers (`int8` in benchmark and inference
// jobs): what torch.ao.quantization.quantize_dynamic({nn.Linear}, dtype=torch.qint8)
// does with its default qconfig, with the same ATen kernels.
//
// Each weight is quantized once, per tensor and symmetric, to qint8 (zero point 0, scale
// max|w| / 127.5, as MinMaxObserver with per_tensor_symmetric computes it) and prepacked
// for the CPU's quantized engine (`quantized::linear_prepack`). At run time
// `quantized::linear_dynamic` quantizes each input to uint8 (7 bits: reduce_range, as
// torch's module does) with the input's own min/max,
// multiplies in int8 with int32 accumulation, adds the fp32 bias and returns fp32.
// Embeddings, LayerNorms, attention and any LoRA adapter stay fp32. CPU only, and for
// inference only: the packed weights carry no gradient.
#pragma once

#include <torch/torch.h>

#include <string>

namespace trainyard {

struct Int8Summary {
  int layers = 0;      // Linear/Conv1D layers quantized
  double fp32_mb = 0;  // their fp32 weights
  double int8_mb = 0;  // the same weights in int8
};

// Quantizes every AdaptableLinear and Conv1D under `model`, in place: each keeps its fp32
// parameters (checkpoints and parameter counts are unchanged) and runs on the int8 copy
// from then on. A family's model keeps its batches padded from then on (Unpadding::kNever):
// packing the tokens would change each input's quantization range. Throws
// std::invalid_argument for a model on another device than the CPU.
Int8Summary QuantizeLinearsInt8(torch::nn::Module& model);

// The packed form of an fp32 weight [out, in] and bias [out] (or undefined).
c10::IValue PackInt8Linear(const torch::Tensor& weight, const torch::Tensor& bias);

// y = x @ W^T + b through the packed weight, for x [..., in] in fp32.
torch::Tensor Int8Linear(const torch::Tensor& x, const c10::IValue& packed);

}  // namespace trainyard
