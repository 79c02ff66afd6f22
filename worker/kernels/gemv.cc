#include "worker/kernels/gemv.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <algorithm>

#include "worker/kernels/gemv_kernels.h"
#include "worker/kernels/parallel_slices.h"

namespace trainyard {
namespace {

torch::Tensor AsRows(const torch::Tensor& x) { return x.reshape({-1, x.size(-1)}).contiguous(); }

torch::Tensor Finish(const torch::Tensor& rows_out, const torch::Tensor& x, const torch::Tensor& bias) {
  if (bias.defined()) rows_out.add_(bias);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = rows_out.size(1);
  return rows_out.view(sizes);
}

}  // namespace

bool RowProductApplies(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!x.defined() || !weight.defined() || x.dim() < 1 || weight.dim() != 2 || x.numel() == 0) return false;
  if (!x.device().is_cpu() || !weight.device().is_cpu()) return false;
  if (x.scalar_type() != torch::kFloat || weight.scalar_type() != torch::kFloat || !weight.is_contiguous())
    return false;
  if (x.numel() / x.size(-1) > kMaxRowProductRows) return false;
  if (torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;  // autocast would run the product in bf16
  return !torch::jit::tracer::isTracing();                        // a trace must record ATen ops
}

torch::Tensor RowsTimesWeight(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.size(-1) == weight.size(0), "RowsTimesWeight: x has ", x.size(-1), " columns, weight ", weight.size(0),
              " rows");
  const torch::Tensor rows = AsRows(x);
  const int64_t m = rows.size(0), k = weight.size(0), n = weight.size(1);
  // Each thread takes a contiguous slice of the weight's rows into its own partial sum.
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), k / 64));
  torch::Tensor partial = torch::zeros({slices, m, n}, rows.options());
  const float* xp = rows.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  float* pp = partial.mutable_data_ptr<float>();
  ParallelSlices(slices, int(slices), [&](int64_t s) {
    gemv::AccumulateWeightRows(xp, m, k, wp, k * s / slices, k * (s + 1) / slices, n, pp + s * m * n);
  });
  return Finish(slices == 1 ? partial[0] : partial.sum(0), x, bias);
}

torch::Tensor RowsTimesWeightT(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.size(-1) == weight.size(1), "RowsTimesWeightT: x has ", x.size(-1), " columns, weight ",
              weight.size(1));
  const torch::Tensor rows = AsRows(x);
  const int64_t m = rows.size(0), k = weight.size(1), n = weight.size(0);
  torch::Tensor out = torch::empty({m, n}, rows.options());
  const float* xp = rows.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  // One contiguous run of output columns (weight rows) per thread.
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / 16));
  ParallelSlices(slices, int(slices),
                 [&](int64_t s) { gemv::DotWeightRows(xp, m, k, wp, n * s / slices, n * (s + 1) / slices, n, op); });
  return Finish(out, x, bias);
}

}  // namespace trainyard
