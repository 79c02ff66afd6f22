// Tolerances derived from the computation, not observed on one CPU.
//
// Two float32 paths of one function (the model unpadded against padded, the first row
// alone against the whole last layer) do not round alike, and a fixed tolerance between
// them holds only for the kernels it was tuned on: ATen picks default, AVX2 or AVX-512
// kernels by the CPU (ATEN_CPU_CAPABILITY), and oneDNN picks its own, each summing in its
// own order. How far the rounding goes also depends on the computation's conditioning,
// which a fixed bound cannot know: a gradient that cancels to zero (an attention key
// bias, to which softmax is blind) is rounding alone, however small the result.
//
// So a float32 result is held against the same computation in float64 (the exact value,
// for float32's purposes), and the bound is the error that the float32 path it replaces
// makes on that same computation, on this CPU's kernels:
//
//   max |candidate - exact|  <=  kRoundingFactor * max(max |baseline - exact|, floor)
//
// where floor = float32's epsilon x max |exact| (one rounding at the tensor's own scale,
// for a baseline that happens to land exactly). Both paths sum the same terms in a
// different order, so their errors are of one size; kRoundingFactor leaves room for the
// larger of two such errors over a tensor's elements. A real fault (a wrong row, a
// dropped term, a missing scale) puts the candidate off by the size of the values, far
// past any rounding.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

namespace trainyard::numeric {

inline constexpr double kRoundingFactor = 8.0;

inline double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// candidate and baseline: float32 results of two paths; exact: the float64 result.
inline ::testing::AssertionResult WithinRoundingOf(const torch::Tensor& candidate, const torch::Tensor& baseline,
                                                   const torch::Tensor& exact, double factor = kRoundingFactor) {
  if (candidate.sizes() != exact.sizes() || baseline.sizes() != exact.sizes())
    return ::testing::AssertionFailure() << "shapes differ: " << candidate.sizes() << ", " << baseline.sizes() << ", "
                                         << exact.sizes();
  const double scale = exact.numel() ? exact.abs().max().item<double>() : 0.0;
  const double floor = std::numeric_limits<float>::epsilon() * scale;
  const double baseline_error = exact.numel() ? MaxAbsDiff(baseline, exact) : 0.0;
  const double candidate_error = exact.numel() ? MaxAbsDiff(candidate, exact) : 0.0;
  const double bound = factor * std::max(baseline_error, floor);
  std::ostringstream detail;
  detail << "candidate's error " << candidate_error << ", the baseline's " << baseline_error << ", floor " << floor
         << " (max |exact| " << scale << "): bound " << bound;
  if (!(candidate_error <= bound)) return ::testing::AssertionFailure() << detail.str();
  return ::testing::AssertionSuccess() << detail.str();
}

// Two float64 results of paths that are equal in exact arithmetic: they may differ by
// float64 rounding alone, relative to the larger values summed (scale, e.g. the largest
// |value| of the result or of its inputs), times a generous count of roundings.
inline ::testing::AssertionResult EqualInFloat64(const torch::Tensor& a, const torch::Tensor& b, double scale,
                                                 double roundings = 1e4) {
  const double bound = roundings * std::numeric_limits<double>::epsilon() * scale;
  const double diff = a.numel() ? MaxAbsDiff(a, b) : 0.0;
  if (!(diff <= bound))
    return ::testing::AssertionFailure() << "float64 results differ by " << diff << ", past " << bound;
  return ::testing::AssertionSuccess();
}

// The forward error bound of float32 matrix products, in any order of summation and so
// on any kernel (Higham, "Accuracy and Stability of Numerical Algorithms", section 3.1):
// each output of a [.., K] x [K, N] product, plus a bias where there is one (one more
// addition), is within gamma_n x (sum_k |a_k| |b_k| + |bias|) of the exact value, where
// gamma_n = n u / (1 - n u), u = 2^-24 and n = K + 1 terms. Returns that bound per output,
// in float64. Two float32 results of one product may differ by twice it.
inline torch::Tensor ProductErrorBound(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bias = {}) {
  const double n = double(a.size(-1) + 1), u = std::ldexp(1.0, -24);
  const double gamma = n * u / (1.0 - n * u);
  torch::Tensor terms = torch::matmul(a.to(torch::kDouble).abs(), b.to(torch::kDouble).abs());
  if (bias.defined()) terms = terms + bias.to(torch::kDouble).abs();
  return gamma * terms;
}

// Whether two float32 results of the product a x b (+ bias) (a [.., K], b [K, N]) are
// within twice ProductErrorBound of each other, element by element.
inline ::testing::AssertionResult SameProduct(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& a,
                                              const torch::Tensor& b, const torch::Tensor& bias = {}) {
  const torch::Tensor bound = 2 * ProductErrorBound(a, b, bias);
  const torch::Tensor diff = (x.to(torch::kDouble) - y.to(torch::kDouble)).abs();
  if (diff.sizes() != bound.sizes())
    return ::testing::AssertionFailure() << "shapes differ: " << diff.sizes() << " against " << bound.sizes();
  const torch::Tensor excess = diff - bound;
  if (excess.max().item<double>() > 0)
    return ::testing::AssertionFailure() << "differ by " << diff.max().item<double>() << " where the error bound is "
                                         << bound.flatten()[excess.flatten().argmax()].item<double>();
  return ::testing::AssertionSuccess();
}

}  // namespace trainyard::numeric
