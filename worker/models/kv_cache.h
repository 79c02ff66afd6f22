// The per-layer key/value cache of a causal LM's generation. Every layer's K and V are
// preallocated for `capacity` positions ([B, heads, capacity, head_dim]), so decode
// steps never allocate and keep fixed addresses (what CUDA-graph capture needs). Step
// t writes its keys at [length, length + T) and attends over [0, length + T).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace trainyard {

class KvCache {
 public:
  KvCache(int64_t layers, int64_t batch, int64_t heads, int64_t capacity, int64_t head_dim,
          const torch::TensorOptions& options);

  // Writes k, v [B, heads, T, head_dim] of `layer` after the cached positions and
  // returns that layer's keys and values so far, [B, heads, length + T, head_dim].
  // Throws std::out_of_range when the capacity would be exceeded.
  std::pair<torch::Tensor, torch::Tensor> Append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v);
  // Marks T more positions as cached, once every layer has appended them.
  void Advance(int64_t steps) { length_ += steps; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

 private:
  std::vector<torch::Tensor> keys_, values_;
  int64_t capacity_, length_ = 0;
};

}  // namespace trainyard
