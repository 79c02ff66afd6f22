// What the CUDA kernels of worker/kernels/ share: 4-wide packs of values, loaded and
// stored with one instruction, and the dispatch over the value types they take. For nvcc
// only (device code).
#pragma once

#include <ATen/ATen.h>

namespace trainyard::cuda {

constexpr int kWarp = 32;
constexpr int kVec = 4;  // values one pack holds

// Four values of T, aligned so that one load or store moves them all.
template <typename T>
struct alignas(kVec * sizeof(T)) Pack {
  T v[kVec];
};

template <typename T>
__device__ __forceinline__ Pack<T> LoadPack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}

template <typename T>
__device__ __forceinline__ void StorePack(T* p, const Pack<T>& pack) {
  *reinterpret_cast<Pack<T>*>(p) = pack;
}

// Calls f(T{}) for the kernels' value types: fp32, bf16, fp16.
template <typename F>
void DispatchValueType(at::ScalarType type, const char* name, F&& f) {
  switch (type) {
    case at::kFloat:
      f(float{});
      break;
    case at::kBFloat16:
      f(at::BFloat16{});
      break;
    case at::kHalf:
      f(at::Half{});
      break;
    default:
      TORCH_CHECK(false, name, ": fp32, bf16 or fp16 expected, got ", type);
  }
}

}  // namespace trainyard::cuda
