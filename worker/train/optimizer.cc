#include "worker/train/optimizer.h"

#include <cmath>
#include <optional>
#include <stdexcept>

namespace trainyard {

AdamW::AdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, AdamWOptions options)
    : options_(options) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    Slot slot{name, p, {}, {}, p.dim() >= 2, {}, {}};
    if (p.scalar_type() != torch::kFloat) {
      slot.master = p.detach().to(torch::kFloat).clone(torch::MemoryFormat::Preserve);
      slot.master_grad = torch::zeros_like(slot.master);
      has_masters_ = true;
    }
    slot.exp_avg = torch::zeros_like(slot.updated(), torch::MemoryFormat::Preserve);
    slot.exp_avg_sq = torch::zeros_like(slot.updated(), torch::MemoryFormat::Preserve);
    slots_.push_back(std::move(slot));
    updated_.push_back(slots_.back().updated());
  }
  torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params.front().second.device();
  step_ = torch::zeros({}, torch::TensorOptions(torch::kFloat).device(device));
}

void AdamW::TakeGradients() {
  gradients_taken_ = true;
  if (!has_masters_) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> from, to;
  for (auto& s : slots_) {
    if (!s.master.defined()) continue;
    if (!s.param.grad().defined()) {
      s.master.mutable_grad() = torch::Tensor();
      continue;
    }
    from.push_back(s.param.grad());
    to.push_back(s.master_grad);
    s.master.mutable_grad() = s.master_grad;
  }
  if (!from.empty()) at::_foreach_copy_(to, from);
}

// Rounds the masters that took a gradient this step into their parameters.
void AdamW::CopyMastersBack() {
  std::vector<torch::Tensor> params, masters;
  for (auto& s : slots_) {
    if (!s.master.defined() || !s.master.grad().defined()) continue;
    params.push_back(s.param);
    masters.push_back(s.master);
  }
  if (!params.empty()) at::_foreach_copy_(params, masters);
}

template <typename Lr>
void AdamW::StepWith(const Lr& lr, const torch::Tensor& found_inf) {
  if (!gradients_taken_) TakeGradients();
  torch::NoGradGuard no_grad;
  // Every slot shares one step tensor, which the kernel only reads: a parameter without
  // a gradient this step keeps the global count for its bias correction next time. As
  // in torch, the count goes up before the kernel and back down after a skipped step.
  step_.add_(1);
  std::optional<torch::Tensor> skip;
  if (found_inf.defined()) skip = found_inf;
  for (bool decay : {true, false}) {
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (auto& s : slots_) {
      const torch::Tensor& updated = s.updated();
      if (s.decay != decay || !updated.grad().defined()) continue;
      params.push_back(updated);
      grads.push_back(updated.grad());
      exp_avgs.push_back(s.exp_avg);
      exp_avg_sqs.push_back(s.exp_avg_sq);
      steps.push_back(step_);
    }
    if (params.empty()) continue;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, options_.beta1,
                      options_.beta2, decay ? options_.weight_decay : 0.0, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, /*grad_scale=*/std::nullopt, skip);
  }
  if (skip) step_.sub_(found_inf.reshape({}));
  // A skipped step left the masters as they were, so copying them back changes nothing.
  if (has_masters_) CopyMastersBack();
}

void AdamW::Step(double lr, const torch::Tensor& found_inf) { StepWith(lr, found_inf); }

void AdamW::Step(const torch::Tensor& lr, const torch::Tensor& found_inf) { StepWith(lr, found_inf); }

int64_t AdamW::step_count() const { return static_cast<int64_t>(step_.to(torch::kCPU).item<double>()); }

void AdamW::ZeroGrad() {
  for (auto& s : slots_) {
    if (s.param.grad().defined()) s.param.mutable_grad() = torch::Tensor();
    if (s.master.defined() && s.master.grad().defined()) s.master.mutable_grad() = torch::Tensor();
  }
  gradients_taken_ = false;
}

std::vector<std::pair<std::string, torch::Tensor>> AdamW::StateTensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& s : slots_) {
    out.emplace_back("exp_avg." + s.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
    if (s.master.defined()) out.emplace_back("master." + s.name, s.master);
  }
  return out;
}

void AdamW::RestoreState(const std::map<std::string, torch::Tensor>& tensors, int64_t step_count) {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    auto restore = [&](const std::string& key, torch::Tensor& target) {
      auto it = tensors.find(key);
      if (it == tensors.end() || it->second.sizes() != target.sizes())
        throw std::runtime_error("optimizer state '" + key + "' is missing or mis-shaped");
      target.copy_(it->second);
    };
    restore("exp_avg." + s.name, s.exp_avg);
    restore("exp_avg_sq." + s.name, s.exp_avg_sq);
    if (s.master.defined()) {
      restore("master." + s.name, s.master);
      s.param.copy_(s.master);
    }
  }
  step_.fill_(double(step_count));
}

void AdamW::ReleaseMasters() {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    if (!s.master.defined()) continue;
    s.param.set_data(s.master.clone());
    s.master = torch::Tensor();
    s.master_grad = torch::Tensor();
  }
  has_masters_ = false;
  updated_.clear();
  for (const auto& s : slots_) updated_.push_back(s.updated());
}

void ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  // The foreach kernels are what clip_grad_norm_ uses on CUDA: a few launches for all the
  // gradients instead of two per tensor (on CPU they run the same per-tensor norms).
  std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2.0);
  torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  torch::Tensor coef = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
}

}  // namespace trainyard
