// The CUDA side of fused_add_norm.h: dropout + residual add + LayerNorm as one forward
// kernel and one backward kernel, each walking a row of the hidden size once.
//
// Layout: a block of kThreads threads owns one row at a time (a grid-stride loop over
// rows); thread t holds columns t, t + kThreads, ... (at most kMaxCols of them) in
// registers, so each row is read once, reduced in registers, and written once. Loads
// are coalesced across a warp for every column slot.
//
// Randomness: Philox, as ATen's own dropout draws it, from the default CUDA generator's
// state taken with philox_cuda_state(). Under CUDA graph capture that state is read on
// the device at replay (at::cuda::philox::unpack), so each replay draws a fresh mask.
// Each (row, thread) is its own Philox subsequence and draws kMaxCols uniforms.
//
// The backward kernel also sums the weight's and bias's gradients over the rows it
// visited, one partial row per block; the caller adds the partials up.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <curand_kernel.h>

#include <ATen/cuda/PhiloxUtils.cuh>
#include <mutex>

#include "worker/kernels/fused_add_norm_cuda.h"

namespace trainyard::cuda {
namespace {

constexpr int kMaxCols = 8;  // columns a thread holds: hidden sizes up to kMaxCols * threads

int ThreadsFor(int64_t hidden) { return hidden > 1024 ? 256 : 128; }

// Sum of `value` over the block; every thread gets the result. `scratch` holds one
// float2 per warp.
__device__ float2 BlockSum(float2 value, float2* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value.x += __shfl_xor_sync(0xffffffffu, value.x, offset);
    value.y += __shfl_xor_sync(0xffffffffu, value.y, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
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

template <typename TX, typename TR>
__global__ void AddNormForwardKernel(const TX* __restrict__ x, const TR* __restrict__ residual,
                                     const float* __restrict__ weight, const float* __restrict__ bias,
                                     TR* __restrict__ y, float* __restrict__ sum_out, float* __restrict__ mean_out,
                                     float* __restrict__ rstd_out, uint8_t* __restrict__ keep_out, int64_t rows,
                                     int hidden, float eps, float p, at::PhiloxCudaState philox) {
  __shared__ float2 scratch[32];
  const bool dropout = p > 0.f;
  const float scale = dropout ? 1.f / (1.f - p) : 1.f;
  uint64_t seed = 0, offset = 0;
  if (dropout) {
    auto seeds = at::cuda::philox::unpack(philox);
    seed = std::get<0>(seeds);
    offset = std::get<1>(seeds);
  }
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
        float xv = static_cast<float>(x[base + c]);
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

template <typename TX, typename TR>
__global__ void AddNormBackwardKernel(const TR* __restrict__ dy, const float* __restrict__ sum,
                                      const float* __restrict__ weight, const float* __restrict__ mean_in,
                                      const float* __restrict__ rstd_in, const uint8_t* __restrict__ keep,
                                      TX* __restrict__ dx, TR* __restrict__ dresidual,
                                      float* __restrict__ dweight_partial, float* __restrict__ dbias_partial,
                                      int64_t rows, int hidden, float p) {
  __shared__ float2 scratch[32];
  const bool dropout = p > 0.f;
  const float scale = dropout ? 1.f / (1.f - p) : 1.f;
  float dweight[kMaxCols], dbias[kMaxCols];
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k) dweight[k] = dbias[k] = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * hidden;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float g[kMaxCols], xhat[kMaxCols];
    float2 partial = make_float2(0.f, 0.f);
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
        partial.x += g[k];
        partial.y += g[k] * xhat[k];
      }
    }
    const float2 totals = BlockSum(partial, scratch);
    const float mean_g = totals.x / hidden, mean_gx = totals.y / hidden;
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < hidden) {
        const float ds = rstd * (g[k] - mean_g - xhat[k] * mean_gx);
        dresidual[base + c] = static_cast<TR>(ds);
        dx[base + c] = static_cast<TX>(dropout ? (keep[base + c] ? ds * scale : 0.f) : ds);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kMaxCols; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < hidden) {
      dweight_partial[static_cast<int64_t>(blockIdx.x) * hidden + c] = dweight[k];
      dbias_partial[static_cast<int64_t>(blockIdx.x) * hidden + c] = dbias[k];
    }
  }
}

int BlocksFor(int64_t rows, int per_sm) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(std::min<int64_t>(rows, static_cast<int64_t>(sms) * per_sm));
}

}  // namespace

bool AddNormFits(int64_t hidden) { return hidden > 0 && hidden <= kMaxCols * ThreadsFor(hidden); }

AddNormForwardResult AddNormForward(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                    const at::Tensor& bias, double eps, double p) {
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
  const int threads = ThreadsFor(hidden);
  const int blocks = BlocksFor(rows, 8);
  at::PhiloxCudaState philox;
  if (p > 0) {
    auto* gen =
        at::get_generator_or_default<at::CUDAGeneratorImpl>(std::nullopt, at::cuda::detail::getDefaultCUDAGenerator());
    const std::lock_guard<std::mutex> lock(gen->mutex_);
    philox = gen->philox_cuda_state(kMaxCols);
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "AddNormForward", [&] {
    auto launch = [&](auto residual_zero) {
      using TR = decltype(residual_zero);
      AddNormForwardKernel<scalar_t, TR><<<blocks, threads, 0, stream>>>(
          x.data_ptr<scalar_t>(), residual.data_ptr<TR>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
          out.y.data_ptr<TR>(), out.sum.data_ptr<float>(), out.mean.data_ptr<float>(), out.rstd.data_ptr<float>(),
          p > 0 ? out.keep.data_ptr<uint8_t>() : nullptr, rows, hidden, static_cast<float>(eps), static_cast<float>(p),
          philox);
    };
    if (residual.scalar_type() == at::kFloat)
      launch(float{});
    else
      launch(scalar_t{});
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

AddNormGrads AddNormBackward(const at::Tensor& dy, const at::Tensor& sum, const at::Tensor& weight,
                             const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& keep, double p,
                             at::ScalarType x_type) {
  const c10::cuda::CUDAGuard guard(dy.device());
  const int hidden = static_cast<int>(dy.size(-1));
  const int64_t rows = dy.numel() / hidden;
  AddNormGrads out;
  out.dx = at::empty(dy.sizes(), dy.options().dtype(x_type));
  out.dresidual = at::empty_like(dy);
  if (rows == 0) {
    out.dweight = at::zeros({hidden}, weight.options());
    out.dbias = at::zeros({hidden}, weight.options());
    return out;
  }
  const int threads = ThreadsFor(hidden);
  const int blocks = BlocksFor(rows, 2);
  at::Tensor dweight_partial = at::empty({blocks, hidden}, weight.options());
  at::Tensor dbias_partial = at::empty({blocks, hidden}, weight.options());
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x_type, "AddNormBackward", [&] {
    auto launch = [&](auto residual_zero) {
      using TR = decltype(residual_zero);
      AddNormBackwardKernel<scalar_t, TR><<<blocks, threads, 0, stream>>>(
          dy.data_ptr<TR>(), sum.data_ptr<float>(), weight.data_ptr<float>(), mean.data_ptr<float>(),
          rstd.data_ptr<float>(), p > 0 ? keep.data_ptr<uint8_t>() : nullptr, out.dx.data_ptr<scalar_t>(),
          out.dresidual.data_ptr<TR>(), dweight_partial.data_ptr<float>(), dbias_partial.data_ptr<float>(), rows,
          hidden, static_cast<float>(p));
    };
    if (dy.scalar_type() == at::kFloat)
      launch(float{});
    else
      launch(scalar_t{});
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  out.dweight = dweight_partial.sum(0);
  out.dbias = dbias_partial.sum(0);
  return out;
}

}  // namespace trainyard::cuda
