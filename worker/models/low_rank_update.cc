#include "worker/models/low_rank_update.h"

#include <ATen/autocast_mode.h>

#include <utility>

namespace trainyard {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

torch::Tensor Rows(const torch::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// y2 [M, N] += scaling * (x2 A^T) B^T over the update's columns; returns h^T = A x2^T
// [r, M], the layout whose products below are fast (see the header).
torch::Tensor AddOne(torch::Tensor& y2, const torch::Tensor& x2, const LowRankUpdate& u) {
  torch::Tensor h_t = at::mm(u.a, x2.t());
  y2.narrow(1, u.column, u.b.size(0)).addmm_(h_t.t(), u.b.t(), 1.0, u.scaling);
  return h_t;
}

class LowRankUpdateFunction : public torch::autograd::Function<LowRankUpdateFunction> {
 public:
  // Variables, in autograd's order: y, x, then each A, then each B (the lists must come
  // as at::TensorList: a std::vector argument would be taken for a non-variable).
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor y, const torch::Tensor& x, at::TensorList as,
                               at::TensorList bs, std::vector<double> scalings, std::vector<int64_t> columns) {
    ctx->mark_dirty({y});
    const torch::Tensor x2 = Rows(x);
    torch::Tensor y2 = y.view({-1, y.size(-1)});
    std::vector<torch::Tensor> saved = {x2};
    std::vector<torch::Tensor> h_ts;
    for (size_t i = 0; i < as.size(); ++i) {
      h_ts.push_back(AddOne(y2, x2, {as[i], bs[i], scalings[i], columns[i]}));
      saved.push_back(as[i]);
      saved.push_back(bs[i]);
    }
    saved.insert(saved.end(), h_ts.begin(), h_ts.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["scalings"] = scalings;
    ctx->saved_data["columns"] = columns;
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    return y;
  }

  // With g = dL/dy over an update's columns and gh^T = scaling * B^T g^T [r, M]:
  // dL/dA = gh^T x, dL/dB = scaling * (h^T g)^T, dL/dx = sum of gh A; y's gradient
  // passes through.
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const std::vector<double> scalings = ctx->saved_data["scalings"].toDoubleVector();
    const std::vector<int64_t> columns = ctx->saved_data["columns"].toIntVector();
    const size_t n = scalings.size();
    const torch::Tensor& x2 = saved[0];
    const torch::Tensor g2 = Rows(grads[0]);
    const bool want_x = ctx->needs_input_grad(1);
    torch::Tensor gx2;
    tensor_list ga(n), gb(n);
    for (size_t i = 0; i < n; ++i) {
      const torch::Tensor& a = saved[1 + 2 * i];
      const torch::Tensor& b = saved[2 + 2 * i];
      const torch::Tensor& h_t = saved[1 + 2 * n + i];
      const torch::Tensor g = g2.narrow(1, columns[i], b.size(0));
      if (ctx->needs_input_grad(2 + n + i)) gb[i] = at::mm(h_t, g).mul_(scalings[i]).t().contiguous();
      const bool want_a = ctx->needs_input_grad(2 + i);
      if (!want_a && !want_x) continue;
      const torch::Tensor gh_t = at::mm(b.t(), g.t()).mul_(scalings[i]);
      if (want_a) ga[i] = at::mm(gh_t, x2);
      if (want_x) gx2 = gx2.defined() ? gx2.addmm_(gh_t.t(), a) : at::mm(gh_t.t(), a);
    }
    tensor_list out = {grads[0], gx2.defined() ? gx2.view(ctx->saved_data["x_sizes"].toIntVector()) : torch::Tensor()};
    out.insert(out.end(), ga.begin(), ga.end());
    out.insert(out.end(), gb.begin(), gb.end());
    out.emplace_back();  // scalings
    out.emplace_back();  // columns
    return out;
  }
};

bool WantsGrad(const torch::Tensor& y, const torch::Tensor& x, const std::vector<LowRankUpdate>& updates) {
  if (!torch::GradMode::is_enabled()) return false;
  if (y.requires_grad() || x.requires_grad()) return true;
  for (const auto& u : updates)
    if (u.a.requires_grad() || u.b.requires_grad()) return true;
  return false;
}

// The in-place products need one dtype throughout and no autocast (which would run
// them in a lower precision than y).
bool SameTypeNoAutocast(const torch::Tensor& y, const torch::Tensor& x, const std::vector<LowRankUpdate>& updates) {
  if (at::autocast::is_autocast_enabled(y.device().type())) return false;
  if (x.scalar_type() != y.scalar_type()) return false;
  for (const auto& u : updates)
    if (u.a.scalar_type() != y.scalar_type() || u.b.scalar_type() != y.scalar_type()) return false;
  return true;
}

// PEFT's formulation, out of place, for autocast and mixed dtypes.
torch::Tensor AddComposed(const torch::Tensor& y, const torch::Tensor& x, const std::vector<LowRankUpdate>& updates) {
  torch::Tensor out = y;
  const int64_t width = y.size(-1);
  for (const auto& u : updates) {
    const torch::Tensor delta = torch::linear(torch::linear(x, u.a), u.b) * u.scaling;
    const int64_t out_features = u.b.size(0);
    if (out_features == width) {
      out = out + delta;
      continue;
    }
    out = torch::cat({out.narrow(-1, 0, u.column), out.narrow(-1, u.column, out_features) + delta,
                      out.narrow(-1, u.column + out_features, width - u.column - out_features)},
                     -1);
  }
  return out;
}

}  // namespace

torch::Tensor AddLowRankUpdates(torch::Tensor y, const torch::Tensor& x, const std::vector<LowRankUpdate>& updates) {
  for (const auto& u : updates)
    TORCH_CHECK(u.column >= 0 && u.column + u.b.size(0) <= y.size(-1) && u.a.size(1) == x.size(-1) &&
                    u.a.size(0) == u.b.size(1),
                "AddLowRankUpdates: an update of shape A ", u.a.sizes(), ", B ", u.b.sizes(), " at column ", u.column,
                " does not fit x ", x.sizes(), " and y ", y.sizes());
  if (updates.empty()) return y;
  if (!SameTypeNoAutocast(y, x, updates)) return AddComposed(y, x, updates);
  if (!WantsGrad(y, x, updates)) {
    // An inference tensor may only change in place under inference mode.
    if (!y.is_contiguous() || (y.is_inference() && !c10::InferenceMode::is_enabled()))
      y = y.clone(at::MemoryFormat::Contiguous);
    torch::Tensor y2 = y.view({-1, y.size(-1)});
    const torch::Tensor x2 = Rows(x);
    for (const auto& u : updates) AddOne(y2, x2, u);
    return y;
  }
  // In place on a view would make autograd copy the view's base around this node, and
  // on a leaf that wants a gradient it is not allowed.
  if (!y.is_contiguous() || y.is_view() || (y.is_leaf() && y.requires_grad()))
    y = y.clone(at::MemoryFormat::Contiguous);
  std::vector<torch::Tensor> as, bs;
  std::vector<double> scalings;
  std::vector<int64_t> columns;
  for (const auto& u : updates) {
    as.push_back(u.a);
    bs.push_back(u.b);
    scalings.push_back(u.scaling);
    columns.push_back(u.column);
  }
  return LowRankUpdateFunction::apply(std::move(y), x, at::TensorList(as), at::TensorList(bs), std::move(scalings),
                                      std::move(columns));
}

}  // namespace trainyard
