// What identifies a set of weights' values without reading them, for the caches that
// keep a derived form of frozen weights between calls (packed_linear.h,
// compute_dtype_weights.h): where each tensor's values are, its shape, and its version
// counter (bumped by every in-place change, under no_grad too). A cache keeps the
// sources' storages alive (SourcesOf), so an address cannot be reused by another
// tensor while a stamp is compared against. Inference tensors keep no version counter;
// they are taken as unchanging.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace trainyard {

struct WeightStamp {
  const void* data = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t version = 0;
  bool operator==(const WeightStamp& other) const {
    return data == other.data && sizes == other.sizes && strides == other.strides && version == other.version;
  }
};

inline WeightStamp StampOf(const torch::Tensor& t) {
  if (!t.defined()) return {};
  return {t.data_ptr(), t.sizes().vec(), t.strides().vec(), t.is_inference() ? -1 : static_cast<int64_t>(t._version())};
}

// The stamps of `weights`, then of `biases` (an undefined bias gets an empty stamp).
inline std::vector<WeightStamp> StampsOf(c10::ArrayRef<torch::Tensor> weights, c10::ArrayRef<torch::Tensor> biases) {
  std::vector<WeightStamp> stamps;
  for (const auto& t : weights) stamps.push_back(StampOf(t));
  for (const auto& t : biases) stamps.push_back(StampOf(t));
  return stamps;
}

// The storages of `weights` and of the defined `biases`, for a cache to keep alive.
inline std::vector<c10::Storage> SourcesOf(c10::ArrayRef<torch::Tensor> weights, c10::ArrayRef<torch::Tensor> biases) {
  std::vector<c10::Storage> storages;
  for (const auto& t : weights) storages.push_back(t.storage());
  for (const auto& t : biases)
    if (t.defined()) storages.push_back(t.storage());
  return storages;
}

// parts concatenated along dim 0; one part is returned as it is (a view stays a view).
inline torch::Tensor Concatenated(c10::ArrayRef<torch::Tensor> parts) {
  return parts.size() == 1 ? parts[0] : torch::cat(parts.vec());
}

}  // namespace trainyard
