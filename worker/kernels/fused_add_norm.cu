// The CUDA side of fused_add_norm.h: dropout + residual add + LayerNorm as one forward
// kernel and one backward kernel, each reading and writing every value once.
//
// Two layouts, chosen per call:
//   - Row per warp (hidden a multiple of 4, at most kMaxWarpChunks * 128, every pointer
//     aligned to 4 of its values): each warp owns one row at a time (a grid-stride loop
//     over rows), and lane l holds the 4-wide column groups l, l + 32, ... in registers.
//     Loads and stores are 4 values wide, and a row's sums take warp shuffles alone, with
//     no block barrier. This is the path BERT's shapes take.
//   - Row per block (any other hidden size up to kMaxCols * threads): thread t holds
//     columns t, t + threads, ..., and a row's sums go through shared memory.
//
// Randomness: Philox, as ATen's own dropout draws it, from the default CUDA generator's
// state taken with philox_cuda_state(). Under CUDA graph capture that state is read on
// the device at replay (at::cuda::philox::unpack), so each replay draws a fresh mask.
// Each (row, thread) is its own Philox subsequence, and the generator's offset advances
// by the most uniforms one thread draws.
//
// x_bias, when given, is the bias of the product that made x, added to x before the
// dropout, so that product can run without its bias epilogue and its gradient needs no
// reduction of its own.
//
// The backward kernels also sum the norm weight's and bias's gradients (and x_bias's)
// over the rows a block visited, in a fixed order, one partial row per gradient per
// block; the caller adds the partials up.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <curand_kernel.h>

#include <ATen/cuda/PhiloxUtils.cuh>
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <type_traits>

#include "worker/kernels/cuda_packs.h"
#include "worker/kernels/fused_add_norm_cuda.h"

namespace trainyard::cuda {
namespace {

constexpr int kMaxCols = 8;           // row per block: columns a thread holds, hidden up to kMaxCols * threads
constexpr int kMaxWarpChunks = 8;     // row per warp: 4-wide groups a lane holds, hidden up to 1024
constexpr int kRowWarpThreads = 128;  // row per warp: 4 rows in flight per block
constexpr int kRowWarpWarps = kRowWarpThreads / kWarp;

int ThreadsFor(int64_t hidden) { return hidden > 1024 ? 256 : 128; }

// ---- shared helpers (and cuda_packs.h) ---------------------------------------------------

__device__ __forceinline__ float2 WarpSum(float2 value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    value.x += __shfl_xor_sync(0xffffffffu, value.x, offset);
    value.y += __shfl_xor_sync(0xffffffffu, value.y, offset);
  }
  return value;
}

// Sum of `value` over the block; every thread gets the result. `scratch` holds one
// float2 per warp.
__device__ float2 BlockSum(float2 value, float2* scratch) {
  value = WarpSum(value);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  float2 total = make_float2(0.f, 0.f);
  for (int w = 0; w < warps; ++w) {
    total.x += scratch[w].x;
    total.y += scratch[w].y;
  }
  __syncthreads();  // scratch is reused by the next call
  return total;
}

__device__ __forceinline__ void PhiloxSeeds(const at::PhiloxCudaState& philox, bool dropout, uint64_t* seed,
                                            uint64_t* offset) {
  *seed = *offset = 0;
  if (!dropout) return;
  auto seeds = at::cuda::philox::unpack(philox);
  *seed = std::get<0>(seeds);
  *offset = std::get<1>(seeds);
}

// ---- row per warp ------------------------------------------------------------------------

template <typename TX, typename TR, int kChunks>
__global__ void __launch_bounds__(kRowWarpThreads)
    AddNormForwardRowWarp(const TX* __restrict__ x, const float* __restrict__ x_bias, const TR* __restrict__ residual,
                          const float* __restrict__ weight, const float* __restrict__ bias, TR* __restrict__ y,
                          float* __restrict__ sum_out, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                          uint8_t* __restrict__ keep_out, int64_t rows, int hidden, float eps, float p,
                          at::PhiloxCudaState philox) {
  const int lane = threadIdx.x % kWarp;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const bool dropout = p > 0.f;
  const float scale = dropout ? 1.f / (1.f - p) : 1.f;
  uint64_t seed, offset;
  PhiloxSeeds(philox, dropout, &seed, &offset);
  for (int64_t row = first; row < rows; row += stride) {
    const int64_t base = row * hidden;
    curandStatePhilox4_32_10_t state;
    if (dropout) curand_init(seed, static_cast<uint64_t>(row) * kWarp + lane, offset, &state);
    float v[kChunks][kVec];
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (j * kWarp + lane) * kVec;
      float u[kVec] = {1.f, 1.f, 1.f, 1.f};
      if (dropout) {
        const float4 r = curand_uniform4(&state);
        u[0] = r.x, u[1] = r.y, u[2] = r.z, u[3] = r.w;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[j][i] = 0.f;
      if (c < hidden) {
        const Pack<TX> xs = LoadPack(x + base + c);
        const Pack<TR> rs = LoadPack(residual + base + c);
        const Pack<float> xb = x_bias ? LoadPack(x_bias + c) : Pack<float>{};
        Pack<uint8_t> keep{};
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          float xv = static_cast<float>(xs.v[i]) + xb.v[i];
          if (dropout) {
            keep.v[i] = u[i] < 1.f - p;
            xv = keep.v[i] ? xv * scale : 0.f;
          }
          v[j][i] = xv + static_cast<float>(rs.v[i]);
          total += v[j][i];
        }
        if (dropout) StorePack(keep_out + base + c, keep);
      }
    }
    const float mean = WarpSum(make_float2(total, 0.f)).x / hidden;
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if ((j * kWarp + lane) * kVec >= hidden) continue;
#pragma unroll
      for (int i = 0; i < kVec; ++i) squares += (v[j][i] - mean) * (v[j][i] - mean);
    }
    const float rstd = rsqrtf(WarpSum(make_float2(squares, 0.f)).x / hidden + eps);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (j * kWarp + lane) * kVec;
      if (c >= hidden) continue;
      const Pack<float> w = LoadPack(weight + c), b = LoadPack(bias + c);
      Pack<float> sums;
      Pack<TR> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        sums.v[i] = v[j][i];
        out.v[i] = static_cast<TR>((v[j][i] - mean) * rstd * w.v[i] + b.v[i]);
      }
      StorePack(sum_out + base + c, sums);
      StorePack(y + base + c, out);
    }
    if (lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
}

// partial: [gridDim.x][kSums][hidden], the weight's, the bias's and (with x_bias)
// x_bias's gradient summed over the rows this block visited (its warps' sums added in
// warp order). kSums is 3 with x_bias, else 2.
template <typename TX, typename TR, int kChunks, int kSums>
__global__ void __launch_bounds__(kRowWarpThreads)
    AddNormBackwardRowWarp(const TR* __restrict__ dy, const float* __restrict__ sum, const float* __restrict__ weight,
                           const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                           const uint8_t* __restrict__ keep, TX* __restrict__ dx, TR* __restrict__ dresidual,
                           float* __restrict__ partial, int64_t rows, int hidden, float p) {
  static_assert(kSums == 2 || kSums == 3, "the norm's weight and bias, and x_bias or not");
  __shared__ float warp_partial[kRowWarpWarps][kSums][kChunks * kWarp * kVec];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const bool dropout = p > 0.f;
  const float scale = dropout ? 1.f / (1.f - p) : 1.f;
  float dweight[kChunks][kVec], dbias[kChunks][kVec], dx_bias[kSums == 3 ? kChunks : 1][kVec];
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
#pragma unroll
    for (int i = 0; i < kVec; ++i) dweight[j][i] = dbias[j][i] = 0.f;
#pragma unroll
  for (int j = 0; j < (kSums == 3 ? kChunks : 1); ++j)
#pragma unroll
    for (int i = 0; i < kVec; ++i) dx_bias[j][i] = 0.f;
  for (int64_t row = first; row < rows; row += stride) {
    const int64_t base = row * hidden;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float g[kChunks][kVec], xhat[kChunks][kVec];
    float2 totals = make_float2(0.f, 0.f);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (j * kWarp + lane) * kVec;
#pragma unroll
      for (int i = 0; i < kVec; ++i) g[j][i] = xhat[j][i] = 0.f;
      if (c >= hidden) continue;
      const Pack<TR> d = LoadPack(dy + base + c);
      const Pack<float> s = LoadPack(sum + base + c), w = LoadPack(weight + c);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float dv = static_cast<float>(d.v[i]);
        xhat[j][i] = (s.v[i] - mean) * rstd;
        g[j][i] = dv * w.v[i];
        dweight[j][i] += dv * xhat[j][i];
        dbias[j][i] += dv;
        totals.x += g[j][i];
        totals.y += g[j][i] * xhat[j][i];
      }
    }
    totals = WarpSum(totals);
    const float mean_g = totals.x / hidden, mean_gx = totals.y / hidden;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (j * kWarp + lane) * kVec;
      if (c >= hidden) continue;
      Pack<uint8_t> kept{};
      if (dropout) kept = LoadPack(keep + base + c);
      Pack<TR> dr;
      Pack<TX> dxs;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float ds = rstd * (g[j][i] - mean_g - xhat[j][i] * mean_gx);
        const float dxv = dropout ? (kept.v[i] ? ds * scale : 0.f) : ds;
        dr.v[i] = static_cast<TR>(ds);
        dxs.v[i] = static_cast<TX>(dxv);
        if constexpr (kSums == 3) dx_bias[j][i] += dxv;
      }
      StorePack(dresidual + base + c, dr);
      StorePack(dx + base + c, dxs);
    }
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = (j * kWarp + lane) * kVec;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      warp_partial[warp][0][c + i] = dweight[j][i];
      warp_partial[warp][1][c + i] = dbias[j][i];
      if constexpr (kSums == 3) warp_partial[warp][2][c + i] = dx_bias[j][i];
    }
  }
  __syncthreads();
  float* block_partial = partial + static_cast<int64_t>(blockIdx.x) * kSums * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
#pragma unroll
    for (int k = 0; k < kSums; ++k) {
      float total = 0.f;
      for (int w = 0; w < kRowWarpWarps; ++w) total += warp_partial[w][k][c];
      block_partial[k * hidden + c] = total;
    }
  }
}

// ---- row per block -----------------------------------------------------------------------

template <typename TX, typename TR>
__global__ void AddNormForwardRowBlock(const TX* __restrict__ x, const float* __restrict__ x_bias,
                                       const TR* __restrict__ residual, const float* __restrict__ weight,
                                       const float* __restrict__ bias, TR* __restrict__ y, float* __restrict__ sum_out,
                                       float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                       uint8_t* __restrict__ keep_out, int64_t rows, int hidden, float eps, float p,
                                       at::PhiloxCudaState philox) {
  __shared__ float2 scratch[32];
  const bool dropout = p > 0.f;
  const float scale = dropout ? 1.f / (1.f - p) : 1.f;
  uint64_t seed, offset;
  PhiloxSeeds(philox, dropout, &seed, &offset);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * hidden;
    float u[kMaxCols];
    if (dropout) {
      curandStatePhilox4_32_10_t state;
      curand_init(seed, static_cast<uint64_t>(row) * blockDim.x + threadIdx.x, offset, &state);
#pragma unroll
      for (int k = 0; k < kMaxCols; k += 4) {
        const float4 r = curand_uniform4(&state);
        u[k] = r.x, u[k + 1] = r.y, u[k + 2] = r.z, u[k + 3] = r.w;
      }
    }
    float v[kMaxCols];
    float2 partial = make_float2(0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      v[k] = 0.f;
      if (c < hidden) {
        float xv = static_cast<float>(x[base + c]) + (x_bias ? x_bias[c] : 0.f);
        if (dropout) {
          const bool keep = u[k] < 1.f - p;
          keep_out[base + c] = keep;
          xv = keep ? xv * scale : 0.f;
        }
        v[k] = xv + static_cast<float>(residual[base + c]);
        partial.x += v[k];
      }
    }
    const float mean = BlockSum(partial, scratch).x / hidden;
    partial = make_float2(0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < hidden) partial.x += (v[k] - mean) * (v[k] - mean);
    }
    const float rstd = rsqrtf(BlockSum(partial, scratch).x / hidden + eps);
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < hidden) {
        sum_out[base + c] = v[k];
        y[base + c] = static_cast<TR>((v[k] - mean) * rstd * weight[c] + bias[c]);
      }
    }
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
}

// partial: as AddNormBackwardRowWarp's, with kSums = sums.
template <typename TX, typename TR>
__global__ void AddNormBackwardRowBlock(const TR* __restrict__ dy, const float* __restrict__ sum,
                                        const float* __restrict__ weight, const float* __restrict__ mean_in,
                                        const float* __restrict__ rstd_in, const uint8_t* __restrict__ keep,
                                        TX* __restrict__ dx, TR* __restrict__ dresidual, float* __restrict__ partial,
                                        int64_t rows, int hidden, float p, int sums) {
  __shared__ float2 scratch[32];
  const bool dropout = p > 0.f;
  const float scale = dropout ? 1.f / (1.f - p) : 1.f;
  float dweight[kMaxCols], dbias[kMaxCols], dx_bias[kMaxCols];
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k) dweight[k] = dbias[k] = dx_bias[k] = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * hidden;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float g[kMaxCols], xhat[kMaxCols];
    float2 partial_sums = make_float2(0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      g[k] = xhat[k] = 0.f;
      if (c < hidden) {
        const float d = static_cast<float>(dy[base + c]);
        xhat[k] = (sum[base + c] - mean) * rstd;
        g[k] = d * weight[c];
        dweight[k] += d * xhat[k];
        dbias[k] += d;
        partial_sums.x += g[k];
        partial_sums.y += g[k] * xhat[k];
      }
    }
    const float2 totals = BlockSum(partial_sums, scratch);
    const float mean_g = totals.x / hidden, mean_gx = totals.y / hidden;
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < hidden) {
        const float ds = rstd * (g[k] - mean_g - xhat[k] * mean_gx);
        const float dxv = dropout ? (keep[base + c] ? ds * scale : 0.f) : ds;
        dresidual[base + c] = static_cast<TR>(ds);
        dx[base + c] = static_cast<TX>(dxv);
        dx_bias[k] += dxv;
      }
    }
  }
  float* block_partial = partial + static_cast<int64_t>(blockIdx.x) * sums * hidden;
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < hidden) {
      block_partial[c] = dweight[k];
      block_partial[hidden + c] = dbias[k];
      if (sums == 3) block_partial[2 * hidden + c] = dx_bias[k];
    }
  }
}

// ---- launch ------------------------------------------------------------------------------

int BlocksFor(int64_t rows, int per_sm) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(std::min<int64_t>(rows, static_cast<int64_t>(sms) * per_sm));
}

int RowWarpBlocksFor(int64_t rows, int per_sm) { return BlocksFor((rows + kRowWarpWarps - 1) / kRowWarpWarps, per_sm); }

// Blocks of `kernel` one SM holds at once at `threads` a block, as its registers and
// static shared memory allow, between 1 and `most`. A grid-stride kernel sized past this
// would run its last blocks as a second wave.
template <typename Kernel>
int ResidentPerSm(Kernel kernel, int threads, int most) {
  int resident = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, 0));
  return std::max(1, std::min(resident, most));
}

// ResidentPerSm() of a row-per-warp backward kernel, at most 4, asked once per kernel: the
// first call comes from an eager pass (a CUDA graph is captured after a warm-up), so no
// capture ever sees the query.
template <typename TX, typename TR, int kChunks, int kSums>
int RowWarpBackwardResident() {
  static const int resident = ResidentPerSm(&AddNormBackwardRowWarp<TX, TR, kChunks, kSums>, kRowWarpThreads, 4);
  return resident;
}

bool AlignedToPack(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % (kVec * t.element_size()) == 0;
}

// The 4-wide groups a lane of the row-per-warp kernels holds for this call (2, 4, 6 or
// 8: fewer instantiations, the unused ones masked), or 0 where that layout does not fit.
int RowWarpChunks(int64_t hidden, std::initializer_list<const at::Tensor*> tensors) {
  if (hidden % kVec != 0 || hidden > kMaxWarpChunks * kWarp * kVec) return 0;
  for (const at::Tensor* t : tensors)
    if (t->defined() && !AlignedToPack(*t)) return 0;
  const int64_t chunks = (hidden + kWarp * kVec - 1) / (kWarp * kVec);
  return static_cast<int>((chunks + 1) / 2 * 2);
}

// Calls f(std::integral_constant<int, chunks>{}) for RowWarpChunks' values.
template <typename F>
void DispatchChunks(int chunks, F&& f) {
  switch (chunks) {
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 6:
      f(std::integral_constant<int, 6>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    default:
      TORCH_CHECK(false, "fused_add_norm: no row-per-warp kernel for ", chunks, " chunks");
  }
}

// Calls f(TX{}, TR{}): x's type, and the residual's (fp32, or x's own).
template <typename F>
void DispatchTypes(at::ScalarType x_type, at::ScalarType residual_type, const char* name, F&& f) {
  DispatchValueType(x_type, name, [&](auto x_zero) {
    if (residual_type == at::kFloat)
      f(x_zero, float{});
    else
      f(x_zero, x_zero);
  });
}

at::PhiloxCudaState TakePhilox(int64_t uniforms_per_thread) {
  auto* gen =
      at::get_generator_or_default<at::CUDAGeneratorImpl>(std::nullopt, at::cuda::detail::getDefaultCUDAGenerator());
  const std::lock_guard<std::mutex> lock(gen->mutex_);
  return gen->philox_cuda_state(uniforms_per_thread);
}

}  // namespace

bool AddNormFits(int64_t hidden) { return hidden > 0 && hidden <= kMaxCols * ThreadsFor(hidden); }

AddNormForwardResult AddNormForward(const at::Tensor& x, const at::Tensor& x_bias, const at::Tensor& residual,
                                    const at::Tensor& weight, const at::Tensor& bias, double eps, double p) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int hidden = static_cast<int>(x.size(-1));
  const int64_t rows = x.numel() / hidden;
  const auto floats = x.options().dtype(at::kFloat);
  AddNormForwardResult out;
  out.y = at::empty_like(residual);
  out.sum = at::empty(x.sizes(), floats);
  out.mean = at::empty({rows}, floats);
  out.rstd = at::empty({rows}, floats);
  if (p > 0) out.keep = at::empty(x.sizes(), x.options().dtype(at::kByte));
  if (rows == 0) return out;
  const int chunks = RowWarpChunks(hidden, {&x, &x_bias, &residual, &weight, &bias});
  const float* xb = x_bias.defined() ? x_bias.data_ptr<float>() : nullptr;
  at::PhiloxCudaState philox;
  if (p > 0) philox = TakePhilox(chunks > 0 ? chunks * kVec : kMaxCols);
  auto stream = at::cuda::getCurrentCUDAStream();
  uint8_t* keep = p > 0 ? out.keep.data_ptr<uint8_t>() : nullptr;
  const auto e = static_cast<float>(eps), drop = static_cast<float>(p);
  DispatchTypes(x.scalar_type(), residual.scalar_type(), "AddNormForward", [&](auto x_zero, auto residual_zero) {
    using TX = decltype(x_zero);
    using TR = decltype(residual_zero);
    const TX* xp = x.data_ptr<TX>();
    const TR* rp = residual.data_ptr<TR>();
    TR* yp = out.y.data_ptr<TR>();
    float *sp = out.sum.data_ptr<float>(), *mp = out.mean.data_ptr<float>(), *vp = out.rstd.data_ptr<float>();
    if (chunks == 0) {
      AddNormForwardRowBlock<TX, TR><<<BlocksFor(rows, 8), ThreadsFor(hidden), 0, stream>>>(
          xp, xb, rp, weight.data_ptr<float>(), bias.data_ptr<float>(), yp, sp, mp, vp, keep, rows, hidden, e, drop,
          philox);
      return;
    }
    DispatchChunks(chunks, [&](auto chunks_constant) {
      AddNormForwardRowWarp<TX, TR, decltype(chunks_constant)::value>
          <<<RowWarpBlocksFor(rows, 16), kRowWarpThreads, 0, stream>>>(xp, xb, rp, weight.data_ptr<float>(),
                                                                       bias.data_ptr<float>(), yp, sp, mp, vp, keep,
                                                                       rows, hidden, e, drop, philox);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

AddNormGrads AddNormBackward(const at::Tensor& dy, const at::Tensor& sum, const at::Tensor& weight,
                             const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& keep, double p,
                             at::ScalarType x_type, bool x_bias) {
  const c10::cuda::CUDAGuard guard(dy.device());
  const int hidden = static_cast<int>(dy.size(-1));
  const int64_t rows = dy.numel() / hidden;
  AddNormGrads out;
  out.dx = at::empty(dy.sizes(), dy.options().dtype(x_type));
  out.dresidual = at::empty_like(dy);
  if (rows == 0) {
    out.dweight = at::zeros({hidden}, weight.options());
    out.dbias = at::zeros({hidden}, weight.options());
    if (x_bias) out.dx_bias = at::zeros({hidden}, weight.options());
    return out;
  }
  const int sums = x_bias ? 3 : 2;
  at::Tensor partial;  // [blocks, sums, hidden], sized with the kernel's grid
  const at::Tensor none;
  const int chunks = RowWarpChunks(hidden, {&dy, &sum, &weight, p > 0 ? &keep : &none, &out.dx, &out.dresidual});
  auto stream = at::cuda::getCurrentCUDAStream();
  const uint8_t* kp = p > 0 ? keep.data_ptr<uint8_t>() : nullptr;
  const auto drop = static_cast<float>(p);
  DispatchTypes(x_type, dy.scalar_type(), "AddNormBackward", [&](auto x_zero, auto residual_zero) {
    using TX = decltype(x_zero);
    using TR = decltype(residual_zero);
    const TR* dyp = dy.data_ptr<TR>();
    const float *sp = sum.data_ptr<float>(), *wp = weight.data_ptr<float>();
    const float *mp = mean.data_ptr<float>(), *vp = rstd.data_ptr<float>();
    TX* dxp = out.dx.data_ptr<TX>();
    TR* drp = out.dresidual.data_ptr<TR>();
    if (chunks == 0) {
      const int blocks = BlocksFor(rows, 2);
      partial = at::empty({blocks, sums, hidden}, weight.options());
      AddNormBackwardRowBlock<TX, TR><<<blocks, ThreadsFor(hidden), 0, stream>>>(
          dyp, sp, wp, mp, vp, kp, dxp, drp, partial.data_ptr<float>(), rows, hidden, drop, sums);
      return;
    }
    DispatchChunks(chunks, [&](auto chunks_constant) {
      constexpr int kChunks = decltype(chunks_constant)::value;
      // With x_bias's sums the kernel holds more registers and shared memory: fewer of
      // its blocks fit an SM, and the grid follows.
      auto launch = [&](auto sums_constant) {
        constexpr int kSums = decltype(sums_constant)::value;
        const int blocks = RowWarpBlocksFor(rows, RowWarpBackwardResident<TX, TR, kChunks, kSums>());
        partial = at::empty({blocks, kSums, hidden}, weight.options());
        AddNormBackwardRowWarp<TX, TR, kChunks, kSums><<<blocks, kRowWarpThreads, 0, stream>>>(
            dyp, sp, wp, mp, vp, kp, dxp, drp, partial.data_ptr<float>(), rows, hidden, drop);
      };
      if (x_bias)
        launch(std::integral_constant<int, 3>{});
      else
        launch(std::integral_constant<int, 2>{});
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor totals = partial.sum(0);
  out.dweight = totals[0];
  out.dbias = totals[1];
  if (x_bias) out.dx_bias = totals[2];
  return out;
}

}  // namespace trainyard::cuda
