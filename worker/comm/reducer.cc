#include "worker/comm/reducer.h"

#include <chrono>
#include <sstream>

#include "worker/log.h"

namespace trainyard {

Reducer::Reducer(std::vector<std::pair<std::string, torch::Tensor>> params, Communicator& comm,
                 ReducerOptions options)
    : comm_(comm), options_(options) {
  for (auto& item : params) params_.push_back(item.second);
  slot_of_.resize(params_.size());
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    if (buckets_.empty() || bytes >= options_.bucket_bytes) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    const int64_t offset = b.offsets.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel();
    slot_of_[k] = {buckets_.size() - 1, b.params.size()};
    b.params.push_back(k);
    b.offsets.push_back(offset);
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (auto& b : buckets_) {
    const int64_t numel = b.offsets.back() + params_[b.params.back()].numel();
    b.buffer = torch::zeros({numel}, params_[b.params.front()].options().requires_grad(false));
  }
  for (size_t k = 0; k < params_.size(); ++k)
    params_[k].register_hook([this, k](torch::Tensor grad) { OnGradient(k, grad); });
}

std::string Reducer::Describe() const {
  std::ostringstream out;
  for (size_t i = 0; i < buckets_.size(); ++i)
    out << (i ? ", " : "") << buckets_[i].params.size() << " params/"
        << StrFormat("%.1f", buckets_[i].buffer.numel() * buckets_[i].buffer.element_size() / 1048576.0) << " MB";
  return out.str();
}

void Reducer::PrepareForBackward() {
  ++step_;
  next_to_launch_ = 0;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.work.reset();
  }
}

void Reducer::OnGradient(size_t param, const torch::Tensor& grad) {
  auto [bucket_index, slot] = slot_of_[param];
  Bucket& b = buckets_[bucket_index];
  torch::NoGradGuard no_grad;
  b.buffer.narrow(0, b.offsets[slot], grad.numel()).copy_(grad.reshape({-1}));
  if (--b.pending == 0 && options_.overlap) LaunchReady(false);
}

void Reducer::LaunchReady(bool force) {
  while (next_to_launch_ < buckets_.size()) {
    Bucket& b = buckets_[next_to_launch_];
    if (!force && b.pending > 0) return;
    if (b.pending > 0) {  // parameters that got no gradient this step contribute zeros
      for (size_t i = 0; i < b.params.size(); ++i)
        if (!params_[b.params[i]].grad().defined())
          b.buffer.narrow(0, b.offsets[i], params_[b.params[i]].numel()).zero_();
    }
    std::string what = StrFormat("grad bucket %zu/%zu of step %ld", next_to_launch_ + 1, buckets_.size(), long(step_));
    b.wire = options_.fp16_compression ? b.buffer.to(torch::kHalf) : b.buffer;
    b.work = comm_.AllReduceAsync(b.wire, ReduceOp::kSum, std::move(what));
    b.launched = true;
    ++next_to_launch_;
  }
}

void Reducer::ContributeZeros() {
  for (auto& b : buckets_) {
    b.buffer.zero_();
    b.pending = 0;
  }
}

double Reducer::FinishBackward() {
  const auto start = std::chrono::steady_clock::now();
  LaunchReady(/*force=*/true);
  torch::NoGradGuard no_grad;
  const double world = comm_.size();
  for (auto& b : buckets_) {
    b.work->Wait();
    if (options_.fp16_compression) b.buffer.copy_(b.wire);
    b.buffer.div_(world);
    for (size_t i = 0; i < b.params.size(); ++i) {
      torch::Tensor& p = params_[b.params[i]];
      torch::Tensor average = b.buffer.narrow(0, b.offsets[i], p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(average);
      } else {
        p.mutable_grad() = average.clone();
      }
    }
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace trainyard
