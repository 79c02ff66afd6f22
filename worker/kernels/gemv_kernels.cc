#include "worker/kernels/gemv_kernels.h"

namespace trainyard::gemv {
namespace {

// Columns per tile: four weight rows' tiles (16 KiB) and a row of out's stay in L1 while
// every row of x is applied to them.
constexpr int64_t kTile = 1024;
// Partial sums per dot product: independent accumulators the compiler turns into one
// vector register, since float addition may not be reordered otherwise.
constexpr int64_t kLanes = 16;

}  // namespace

// Four weight rows at a time, so out is loaded and stored once per four rows read.
__attribute__((target_clones("avx512f", "avx2", "default"))) void AccumulateWeightRows(
    const float* __restrict x, int64_t rows, int64_t k, const float* __restrict w, int64_t k0, int64_t k1, int64_t n,
    float* __restrict out) {
  int64_t r = k0;
  for (; r + 4 <= k1; r += 4) {
    const float* w0 = w + r * n;
    const float* w1 = w0 + n;
    const float* w2 = w1 + n;
    const float* w3 = w2 + n;
    for (int64_t c0 = 0; c0 < n; c0 += kTile) {
      const int64_t c1 = c0 + kTile < n ? c0 + kTile : n;
      for (int64_t m = 0; m < rows; ++m) {
        const float* xm = x + m * k + r;
        const float a0 = xm[0], a1 = xm[1], a2 = xm[2], a3 = xm[3];
        float* o = out + m * n;
        for (int64_t c = c0; c < c1; ++c) o[c] += a0 * w0[c] + a1 * w1[c] + a2 * w2[c] + a3 * w3[c];
      }
    }
  }
  for (; r < k1; ++r) {
    const float* w0 = w + r * n;
    for (int64_t m = 0; m < rows; ++m) {
      const float a0 = x[m * k + r];
      float* o = out + m * n;
      for (int64_t c = 0; c < n; ++c) o[c] += a0 * w0[c];
    }
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void DotWeightRows(const float* __restrict x, int64_t rows,
                                                                                int64_t k, const float* __restrict w,
                                                                                int64_t j0, int64_t j1, int64_t n,
                                                                                float* __restrict out) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* wj = w + j * k;
    for (int64_t m = 0; m < rows; ++m) {
      const float* xm = x + m * k;
      float lanes[kLanes] = {};
      int64_t i = 0;
      for (; i + kLanes <= k; i += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] += wj[i + l] * xm[i + l];
      float sum = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
      for (; i < k; ++i) sum += wj[i] * xm[i];
      out[m * n + j] = sum;
    }
  }
}

}  // namespace trainyard::gemv
