#include "worker/models/low_rank_update.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace trainyard {
namespace {

// PEFT's formulation in plain torch ops: y + linear(linear(x, A), B) * scaling over
// each update's columns, out of place; libtorch's autograd differentiates it.
torch::Tensor Composed(const torch::Tensor& y, const torch::Tensor& x, const std::vector<LowRankUpdate>& updates) {
  torch::Tensor out = y.clone();
  for (const auto& u : updates) {
    const torch::Tensor delta = torch::linear(torch::linear(x, u.a), u.b) * u.scaling;
    const int64_t width = y.size(-1), end = u.column + u.b.size(0);
    const auto zeros = [&](int64_t n) { return torch::zeros({y.size(0), y.size(1), n}); };
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
  ASSERT_TRUE(got.allclose(expected, 1e-6, 1e-5));
  const std::vector<torch::Tensor> got_grads = torch::autograd::grad({(got * weights).sum()}, Leaves(c));
  const char* names[] = {"y", "x", "A0", "B0", "A1", "B1"};
  for (size_t i = 0; i < got_grads.size(); ++i)
    EXPECT_TRUE(got_grads[i].allclose(expected_grads[i], 1e-6, 1e-5)) << names[i];
}

TEST(AddLowRankUpdates, ChangesAContiguousYInPlaceAndCopiesAnotherFirst) {
  const Case c = MakeCase();
  torch::NoGradGuard no_grad;
  torch::Tensor y = c.y.clone();
  const torch::Tensor expected = Composed(c.y, c.x, c.updates);
  const torch::Tensor got = AddLowRankUpdates(y, c.x, c.updates);
  EXPECT_EQ(got.data_ptr(), y.data_ptr());
  EXPECT_TRUE(got.allclose(expected, 1e-6, 1e-5));
  // A transposed y is left alone.
  const torch::Tensor y_t = c.y.transpose(0, 1).contiguous().transpose(0, 1);
  const torch::Tensor before = y_t.clone();
  const torch::Tensor from_view = AddLowRankUpdates(y_t, c.x, c.updates);
  EXPECT_TRUE(y_t.equal(before));
  EXPECT_TRUE(from_view.allclose(expected, 1e-6, 1e-5));
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
  EXPECT_TRUE(got.to(torch::kFloat).allclose(Composed(c.y, c.x, c.updates), 0.05, 0.1));
}

TEST(AddLowRankUpdates, RefusesAnUpdatePastTheColumns) {
  const Case c = MakeCase();
  std::vector<LowRankUpdate> past = {c.updates[1]};
  past[0].column = 9;
  EXPECT_THROW(AddLowRankUpdates(c.y.detach().clone(), c.x, past), c10::Error);
}

}  // namespace
}  // namespace trainyard
