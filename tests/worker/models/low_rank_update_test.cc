#include "worker/models/low_rank_update.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "tests/worker/numeric_bounds.h"

namespace trainyard {
namespace {

// PEFT's formulation in plain torch ops: y + linear(linear(x, A), B) * scaling over
// each update's columns, out of place; libtorch's autograd differentiates it.
torch::Tensor Composed(const torch::Tensor& y, const torch::Tensor& x, const std::vector<LowRankUpdate>& updates) {
  torch::Tensor out = y.clone();
  for (const auto& u : updates) {
    const torch::Tensor delta = torch::linear(torch::linear(x, u.a), u.b) * u.scaling;
    const int64_t width = y.size(-1), end = u.column + u.b.size(0);
    const auto zeros = [&](int64_t n) { return torch::zeros({y.size(0), y.size(1), n}, y.options()); };
    out = out + torch::cat({zeros(u.column), delta, zeros(width - end)}, -1);
  }
  return out;
}

struct Case {
  torch::Tensor y, x;
  std::vector<LowRankUpdate> updates;
};

// y [2, 5, 12], x [2, 5, 6]; rank-3 updates on columns 0..3 (scaling 0.5) and 8..11
// (scaling 2), every tensor wanting a gradient.
Case MakeCase() {
  torch::manual_seed(3);
  Case c;
  c.y = torch::randn({2, 5, 12}, torch::requires_grad());
  c.x = torch::randn({2, 5, 6}, torch::requires_grad());
  c.updates.push_back(
      {torch::randn({3, 6}, torch::requires_grad()), torch::randn({4, 3}, torch::requires_grad()), 0.5, 0});
  c.updates.push_back(
      {torch::randn({3, 6}, torch::requires_grad()), torch::randn({4, 3}, torch::requires_grad()), 2.0, 8});
  return c;
}

// The same case in float64, each tensor a leaf of its own: the exact values that the
// float32 paths round (tests/worker/numeric_bounds.h).
Case InFloat64(const Case& c) {
  const auto leaf = [](const torch::Tensor& t) {
    return t.detach().to(torch::kDouble).requires_grad_(t.requires_grad());
  };
  Case d{leaf(c.y), leaf(c.x), {}};
  for (const auto& u : c.updates) d.updates.push_back({leaf(u.a), leaf(u.b), u.scaling, u.column});
  return d;
}

std::vector<torch::Tensor> Leaves(const Case& c) {
  std::vector<torch::Tensor> leaves = {c.y, c.x};
  for (const auto& u : c.updates) leaves.insert(leaves.end(), {u.a, u.b});
  return leaves;
}

TEST(AddLowRankUpdates, ValuesAndEveryGradientEqualTheComposedOps) {
  const Case c = MakeCase();
  const torch::Tensor weights = torch::randn({2, 5, 12});
  const torch::Tensor expected = Composed(c.y, c.x, c.updates);
  const std::vector<torch::Tensor> expected_grads = torch::autograd::grad({(expected * weights).sum()}, Leaves(c));
  // y is a leaf that wants a gradient: it is copied, not changed.
  const torch::Tensor before = c.y.detach().clone();
  const torch::Tensor got = AddLowRankUpdates(c.y, c.x, c.updates);
  EXPECT_TRUE(c.y.equal(before));
  // Both float32 paths against the float64 composed ops: ours within a few times the
  // error the composed ops make (numeric::WithinRoundingOf).
  const Case d = InFloat64(c);
  const torch::Tensor exact = Composed(d.y, d.x, d.updates);
  const std::vector<torch::Tensor> exact_grads =
      torch::autograd::grad({(exact * weights.to(torch::kDouble)).sum()}, Leaves(d));
  ASSERT_TRUE(numeric::WithinRoundingOf(got, expected, exact));
  const std::vector<torch::Tensor> got_grads = torch::autograd::grad({(got * weights).sum()}, Leaves(c));
  const char* names[] = {"y", "x", "A0", "B0", "A1", "B1"};
  for (size_t i = 0; i < got_grads.size(); ++i)
    EXPECT_TRUE(numeric::WithinRoundingOf(got_grads[i], expected_grads[i], exact_grads[i])) << names[i];
}

TEST(AddLowRankUpdates, ChangesAContiguousYInPlaceAndCopiesAnotherFirst) {
  const Case c = MakeCase();
  torch::NoGradGuard no_grad;
  torch::Tensor y = c.y.clone();
  const torch::Tensor expected = Composed(c.y, c.x, c.updates);
  const Case d = InFloat64(c);
  const torch::Tensor exact = Composed(d.y, d.x, d.updates);
  const torch::Tensor got = AddLowRankUpdates(y, c.x, c.updates);
  EXPECT_EQ(got.data_ptr(), y.data_ptr());
  EXPECT_TRUE(numeric::WithinRoundingOf(got, expected, exact));
  // A transposed y is left alone.
  const torch::Tensor y_t = c.y.transpose(0, 1).contiguous().transpose(0, 1);
  const torch::Tensor before = y_t.clone();
  const torch::Tensor from_view = AddLowRankUpdates(y_t, c.x, c.updates);
  EXPECT_TRUE(y_t.equal(before));
  EXPECT_TRUE(numeric::WithinRoundingOf(from_view, expected, exact));
}

TEST(AddLowRankUpdates, OnlyWhatWantsAGradientGetsOne) {
  Case c = MakeCase();
  c.x = c.x.detach();
  c.updates[0].a = c.updates[0].a.detach();
  const torch::Tensor got = AddLowRankUpdates(c.y * 1.0, c.x, c.updates);
  got.sum().backward();
  EXPECT_FALSE(c.x.grad().defined());
  EXPECT_FALSE(c.updates[0].a.grad().defined());
  EXPECT_TRUE(c.updates[0].b.grad().defined());
  EXPECT_TRUE(c.updates[1].a.grad().defined());
}

TEST(AddLowRankUpdates, UnderAutocastItFallsBackToTheComposedOps) {
  const Case c = MakeCase();
  torch::Tensor got;
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    got = AddLowRankUpdates(c.y * 1.0, c.x, c.updates);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  // bf16 rounds x, A, B, the two products and the scaled update: six roundings of at most
  // 2^-9 each, relative to the terms summed. Each output is held within eight such
  // roundings of the sum of the magnitudes of its terms (|y| + scaling |x||A||B|),
  // computed in float64 from the same composition over the magnitudes.
  const Case d = InFloat64(c);
  const torch::Tensor exact = Composed(d.y, d.x, d.updates).detach();
  Case magnitudes{d.y.detach().abs(), d.x.detach().abs(), {}};
  for (const auto& u : d.updates)
    magnitudes.updates.push_back({u.a.detach().abs(), u.b.detach().abs(), u.scaling, u.column});
  const torch::Tensor bound = 8 * std::ldexp(1.0, -9) * Composed(magnitudes.y, magnitudes.x, magnitudes.updates);
  const torch::Tensor error = (got.to(torch::kDouble) - exact).abs();
  EXPECT_LE((error - bound).max().item<double>(), 0.0)
      << "error " << error.max().item<double>() << " where the bound is "
      << bound.flatten()[(error - bound).flatten().argmax()].item<double>();
  // And it is a bf16 computation, not float32's: the bound is not met trivially.
  EXPECT_GT(error.max().item<double>(), 1e-6);
}

TEST(AddLowRankUpdates, RefusesAnUpdatePastTheColumns) {
  const Case c = MakeCase();
  std::vector<LowRankUpdate> past = {c.updates[1]};
  past[0].column = 9;
  EXPECT_THROW(AddLowRankUpdates(c.y.detach().clone(), c.x, past), c10::Error);
}

}  // namespace
}  // namespace trainyard
