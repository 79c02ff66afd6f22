#include "worker/models/kv_cache.h"

#include <stdexcept>
#include <string>

namespace trainyard {

KvCache::KvCache(int64_t layers, int64_t batch, int64_t heads, int64_t capacity, int64_t head_dim,
                 const torch::TensorOptions& options)
    : capacity_(capacity) {
  for (int64_t i = 0; i < layers; ++i) {
    keys_.push_back(torch::zeros({batch, heads, capacity, head_dim}, options));
    values_.push_back(torch::zeros({batch, heads, capacity, head_dim}, options));
  }
}

std::pair<torch::Tensor, torch::Tensor> KvCache::Append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) {
  if (fixed_shape()) {
    if (k.size(2) != 1) throw std::invalid_argument("KV cache: a write slot takes one position a step");
    keys_[layer].index_copy_(2, slot_, k);
    values_[layer].index_copy_(2, slot_, v);
    return {keys_[layer], values_[layer]};
  }
  const int64_t steps = k.size(2), end = length_ + steps;
  if (end > capacity_)
    throw std::out_of_range("KV cache: " + std::to_string(end) + " positions exceed its capacity " +
                            std::to_string(capacity_));
  keys_[layer].narrow(2, length_, steps).copy_(k);
  values_[layer].narrow(2, length_, steps).copy_(v);
  return {keys_[layer].narrow(2, 0, end), values_[layer].narrow(2, 0, end)};
}

}  // namespace trainyard
