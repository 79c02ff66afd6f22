// The CUDA side of fused_bias_gelu.h: a product's bias added and GELU applied in one
// pass forward, and GELU's derivative applied and the bias's gradient summed in one pass
// backward.
//
// Layout: 4-wide loads and stores (cols % 4 == 0, every pointer aligned to 4 values).
//   - Forward: a grid-stride loop over the 4-value groups of x; each group's bias is the
//     4 fp32 values at its column.
//   - Backward: the grid is (column tiles of 128, row groups). In a block of 8 warps,
//     lane l of every warp owns columns tile * 128 + 4l .. + 3, so a warp reads 128
//     consecutive values of a row (coalesced); warp w visits rows w, w + 8, ... of the
//     block's row group's grid-stride. Each thread sums its columns' dx in fp32 over the
//     rows it visited; the block adds its 8 warps' sums through shared memory, in a
//     fixed order, and writes one partial row per row group. The caller adds the
//     partials up (one small reduction, where autograd launches a full [rows, cols] one
//     for the product's bias).
//
// GELU's value and derivative are ATen's own formulas (the erf form, in fp32):
//   gelu(u)  = u * Phi(u),            Phi(u) = 0.5 * (1 + erf(u / sqrt 2))
//   gelu'(u) = Phi(u) + u * phi(u),   phi(u) = exp(-u^2 / 2) / sqrt(2 pi)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

#include "worker/kernels/cuda_packs.h"
#include "worker/kernels/fused_bias_gelu_cuda.h"

namespace trainyard::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTileCols = kWarp * kVec;  // columns one backward block covers
constexpr float kSqrtHalf = 0.70710678118654752440f;
constexpr float kInvSqrtTwoPi = 0.39894228040143267794f;

__device__ __forceinline__ float Gelu(float u) { return u * 0.5f * (1.0f + erff(u * kSqrtHalf)); }

__device__ __forceinline__ float GeluSlope(float u) {
  const float cdf = 0.5f * (1.0f + erff(u * kSqrtHalf));
  return cdf + u * kInvSqrtTwoPi * expf(-0.5f * u * u);
}

template <typename T>
__global__ void BiasGeluForwardKernel(const T* __restrict__ x, const float* __restrict__ bias, T* __restrict__ y,
                                      int64_t groups, int64_t cols) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const int64_t first = g * kVec;
    const Pack<T> in = LoadPack(x + first);
    const Pack<float> b = LoadPack(bias + first % cols);
    Pack<T> out;
#pragma unroll
    for (int i = 0; i < kVec; ++i) out.v[i] = static_cast<T>(Gelu(static_cast<float>(in.v[i]) + b.v[i]));
    StorePack(y + first, out);
  }
}

// partial: [gridDim.y, cols] fp32, or null for no bias gradient.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    BiasGeluBackwardKernel(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ bias,
                           T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t cols) {
  __shared__ Pack<float> sums[kWarps][kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileCols + int64_t(lane) * kVec;
  const bool owns = col < cols;
  Pack<float> sum = {};
  if (owns) {
    const Pack<float> b = LoadPack(bias + col);
    const int64_t row_stride = static_cast<int64_t>(gridDim.y) * kWarps;
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * kWarps + warp; row < rows; row += row_stride) {
      const int64_t at = row * cols + col;
      const Pack<T> g = LoadPack(dy + at), in = LoadPack(x + at);
      Pack<T> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float d = static_cast<float>(g.v[i]) * GeluSlope(static_cast<float>(in.v[i]) + b.v[i]);
        out.v[i] = static_cast<T>(d);
        sum.v[i] += d;
      }
      StorePack(dx + at, out);
    }
  }
  if (partial == nullptr) return;
  sums[warp][lane] = sum;
  __syncthreads();
  if (warp != 0 || !owns) return;
  for (int w = 1; w < kWarps; ++w) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum.v[i] += sums[w][lane].v[i];
  }
  StorePack(partial + static_cast<int64_t>(blockIdx.y) * cols + col, sum);
}

int SmCount() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

}  // namespace

bool BiasGeluFits(int64_t cols) { return cols > 0 && cols % kVec == 0; }

at::Tensor BiasGeluForward(const at::Tensor& x, const at::Tensor& bias) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  const int64_t cols = x.size(-1), groups = x.numel() / kVec;
  if (groups == 0) return y;
  const int blocks = static_cast<int>(std::min<int64_t>((groups + kThreads - 1) / kThreads, int64_t(SmCount()) * 8));
  auto stream = at::cuda::getCurrentCUDAStream();
  DispatchValueType(x.scalar_type(), "BiasGeluForward", [&](auto zero) {
    using T = decltype(zero);
    BiasGeluForwardKernel<T>
        <<<blocks, kThreads, 0, stream>>>(x.data_ptr<T>(), bias.data_ptr<float>(), y.data_ptr<T>(), groups, cols);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

BiasGeluGrads BiasGeluBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias, bool bias_grad) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  BiasGeluGrads out;
  out.dx = at::empty_like(x);
  if (rows == 0) {
    if (bias_grad) out.dbias = at::zeros({cols}, bias.options());
    return out;
  }
  const int64_t tiles = (cols + kTileCols - 1) / kTileCols;
  // About 4 blocks an SM in all, and at least a warp's row per block.
  const int64_t row_groups =
      std::clamp<int64_t>((int64_t(SmCount()) * 4 + tiles - 1) / tiles, 1, (rows + kWarps - 1) / kWarps);
  at::Tensor partial = bias_grad ? at::empty({row_groups, cols}, bias.options()) : at::Tensor();
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(row_groups));
  auto stream = at::cuda::getCurrentCUDAStream();
  DispatchValueType(x.scalar_type(), "BiasGeluBackward", [&](auto zero) {
    using T = decltype(zero);
    BiasGeluBackwardKernel<T>
        <<<grid, kThreads, 0, stream>>>(dy.data_ptr<T>(), x.data_ptr<T>(), bias.data_ptr<float>(), out.dx.data_ptr<T>(),
                                        bias_grad ? partial.data_ptr<float>() : nullptr, rows, cols);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (bias_grad) out.dbias = row_groups == 1 ? partial[0] : partial.sum(0);
  return out;
}

}  // namespace trainyard::cuda
