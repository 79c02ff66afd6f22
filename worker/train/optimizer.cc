#include "worker/train/optimizer.h"

#include <cmath>
#include <stdexcept>

namespace trainyard {

AdamW::AdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, AdamWOptions options)
    : options_(options) {
  for (const auto& [name, p] : params)
    slots_.push_back({name, p, torch::zeros_like(p, torch::MemoryFormat::Preserve),
                      torch::zeros_like(p, torch::MemoryFormat::Preserve), p.dim() >= 2});
}

void AdamW::Step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_count_;
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, double(step_count_));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(options_.beta2, double(step_count_)));
  const double step_size = lr / bias_correction1;
  for (auto& s : slots_) {
    if (!s.param.grad().defined()) continue;
    const torch::Tensor& grad = s.param.grad();
    if (s.decay) s.param.mul_(1.0 - lr * options_.weight_decay);
    s.exp_avg.lerp_(grad, 1.0 - options_.beta1);
    s.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    torch::Tensor denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options_.eps);
    s.param.addcdiv_(s.exp_avg, denom, -step_size);
  }
}

void AdamW::ZeroGrad() {
  for (auto& s : slots_)
    if (s.param.grad().defined()) s.param.mutable_grad() = torch::Tensor();
}

std::vector<std::pair<std::string, torch::Tensor>> AdamW::StateTensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& s : slots_) {
    out.emplace_back("exp_avg." + s.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
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
  }
  step_count_ = step_count;
}

void ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads, norms;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad()), norms.push_back(p.grad().norm(2.0));
  if (grads.empty()) return;
  torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  torch::Tensor coef = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef);
}

double LinearWarmupDecay(double peak, int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (warmup_steps > 0 && step < warmup_steps) return peak * double(step + 1) / double(warmup_steps);
  if (total_steps <= warmup_steps) return peak;
  double remaining = double(total_steps - step) / double(total_steps - warmup_steps);
  return peak * std::max(0.0, remaining);
}

}  // namespace trainyard
