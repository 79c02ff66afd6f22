// The per-layer key/value cache of a causal LM's generation. Every layer's K and V are
// preallocated for `capacity` positions ([B, heads, capacity, head_dim]), so decode
// steps never allocate and keep fixed addresses (what CUDA-graph capture needs).
//
// Two ways to write it:
//  - by length (the default): step t writes its keys at [length, length + T) and
//    attends over [0, length + T); shapes grow with every step.
//  - at a write slot (UseWriteSlot): one position a step, written at the index a
//    device tensor holds, and the step attends over all `capacity` positions, the
//    unwritten ones masked by the caller. Every shape and address is then the same
//    from step to step, so a decode step can be captured once and replayed; the
//    caller moves the slot on between replays.
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
  // Throws std::out_of_range when the capacity would be exceeded. At a write slot: T
  // must be 1; writes at the slot and returns all capacity positions.
  std::pair<torch::Tensor, torch::Tensor> Append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v);
  // Marks T more positions as cached, once every layer has appended them. No-op at a
  // write slot (the slot tensor is the position).
  void Advance(int64_t steps) {
    if (!fixed_shape()) length_ += steps;
  }
  // From now on, writes go to the position `slot` ([1] int64, on the cache's device)
  // holds. REQUIRES: the slot stays below capacity whenever a step runs.
  void UseWriteSlot(torch::Tensor slot) { slot_ = std::move(slot); }
  bool fixed_shape() const { return slot_.defined(); }
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

 private:
  std::vector<torch::Tensor> keys_, values_;
  int64_t capacity_, length_ = 0;
  torch::Tensor slot_;
};

}  // namespace trainyard
