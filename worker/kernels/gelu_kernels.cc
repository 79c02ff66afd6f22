#include "worker/kernels/gelu_kernels.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace trainyard::gelu {
namespace {

constexpr float kP = 0.3275911f, kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f, kA4 = -1.453152027f,
                kA5 = 1.061405429f;
constexpr float kSqrtHalf = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;

// What the vector loop computes, one element at a time: for the tail, and for CPUs
// without AVX2 (GCC leaves this loop scalar: the exp's bit tricks defeat its vectoriser).
void Scalar(const float* u, int64_t n, float* y, float* slope) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = u[i], a = std::fabs(x) * kSqrtHalf;
    const float t = 1.0f / (kP * a + 1.0f);
    const float r = ((((kA5 * t + kA4) * t + kA3) * t + kA2) * t + kA1) * t;
    const float e = std::exp(-a * a);
    const float cdf = 0.5f + 0.5f * std::copysign(1.0f - r * e, x);
    y[i] = x * cdf;
    slope[i] = cdf + x * e * kInvSqrt2Pi;
  }
}

#if defined(__x86_64__)
// exp(v) for v <= 0 (inputs below -87 give exp(-87), still a normal float): Cody-Waite
// range reduction to r in [-ln2/2, ln2/2], a degree-7 polynomial (Cephes' expf), and
// 2^n put into the exponent bits.
__attribute__((target("avx2,fma"))) inline __m256 ExpNonPositive(__m256 v) {
  v = _mm256_max_ps(v, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_to_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
}

__attribute__((target("avx2,fma"))) void Avx2(const float* u, int64_t n, float* y, float* slope) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(u + i);
    const __m256 a = _mm256_mul_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(kSqrtHalf));
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(kP), a, one));
    __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(kA5), t, _mm256_set1_ps(kA4));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kA3));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kA2));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kA1));
    r = _mm256_mul_ps(r, t);
    const __m256 e = ExpNonPositive(_mm256_mul_ps(_mm256_xor_ps(sign, a), a));
    const __m256 erf = _mm256_or_ps(_mm256_fnmadd_ps(r, e, one), _mm256_and_ps(sign, x));
    const __m256 cdf = _mm256_fmadd_ps(half, erf, half);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(x, cdf));
    _mm256_storeu_ps(slope + i, _mm256_fmadd_ps(_mm256_mul_ps(x, e), _mm256_set1_ps(kInvSqrt2Pi), cdf));
  }
  Scalar(u + i, n - i, y + i, slope + i);
}
#endif

}  // namespace

void GeluWithSlope(const float* u, int64_t n, float* y, float* slope) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return Avx2(u, n, y, slope);
#endif
  Scalar(u, n, y, slope);
}

}  // namespace trainyard::gelu
