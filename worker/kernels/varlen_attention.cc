#include "worker/kernels/varlen_attention.h"

#include <stdexcept>
#include <tuple>

#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace trainyard {
namespace {

#ifdef TRAINYARD_WITH_CUDA
bool FlashCapable(const torch::Device& device) { return at::cuda::getDeviceProperties(device.index())->major >= 8; }
#endif

}  // namespace

bool VarlenAttentionApplies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#ifdef TRAINYARD_WITH_CUDA
  for (const torch::Tensor* t : {&q, &k, &v}) {
    if (!t->defined() || !t->is_cuda() || t->dim() != 3 || t->device() != q.device()) return false;
    if (t->scalar_type() != q.scalar_type() || t->stride(-1) != 1) return false;
  }
  if (q.scalar_type() != torch::kBFloat16 && q.scalar_type() != torch::kHalf) return false;
  const int64_t head = q.size(2);
  if (head % 8 != 0 || head > 256 || k.size(2) != head || v.size(2) != head) return false;
  if (k.size(1) != q.size(1) || v.size(1) != q.size(1) || v.size(0) != k.size(0)) return false;
  return FlashCapable(q.device());
#else
  (void)q;
  (void)k;
  (void)v;
  return false;
#endif
}

torch::Tensor VarlenAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& q_starts, const torch::Tensor& k_starts, int64_t longest_q,
                              int64_t longest_k, double dropout, std::optional<double> scale) {
  if (!VarlenAttentionApplies(q, k, v)) throw std::invalid_argument("VarlenAttention: these tensors do not fit it");
  if (q_starts.scalar_type() != torch::kInt || k_starts.scalar_type() != torch::kInt ||
      q_starts.numel() != k_starts.numel() || q_starts.device() != q.device() || k_starts.device() != q.device())
    throw std::invalid_argument("VarlenAttention: the starts must be int32 on the tensors' device, one per sequence");
  return std::get<0>(at::_flash_attention_forward(q, k, v, q_starts, k_starts, longest_q, longest_k, dropout,
                                                  /*is_causal=*/false, /*return_debug_mask=*/false, scale));
}

}  // namespace trainyard
