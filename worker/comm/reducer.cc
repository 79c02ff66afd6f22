#include "worker/comm/reducer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <map>
#include <sstream>
#include <stdexcept>

#include "common/log.h"

namespace trainyard {

Reducer::Reducer(const std::vector<std::pair<std::string, torch::Tensor>>& params, Communicator& comm,
                 ReducerOptions options)
    : comm_(comm), options_(options) {
  for (const auto& item : params) params_.push_back(item.second);
  slot_of_.resize(params_.size());
  // The bucket being filled for each dtype, and its bytes so far.
  std::map<torch::ScalarType, std::pair<size_t, int64_t>> open;
  for (size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    auto it = open.find(p.scalar_type());
    if (it == open.end() || it->second.second >= options_.bucket_bytes) {
      buckets_.emplace_back();
      it = open.insert_or_assign(p.scalar_type(), std::pair<size_t, int64_t>{buckets_.size() - 1, 0}).first;
    }
    Bucket& b = buckets_[it->second.first];
    slot_of_[k] = {it->second.first, b.params.size()};
    b.params.push_back(k);
    b.offsets.push_back(b.grad_numel);
    b.grad_numel += p.numel();
    it->second.second += p.numel() * static_cast<int64_t>(p.element_size());
  }
  views_.resize(params_.size());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    const int64_t vote_slot = i == 0 ? 1 : 0;
    b.buffer = torch::zeros({b.grad_numel + vote_slot}, params_[b.params.front()].options().requires_grad(false));
    for (size_t j = 0; j < b.params.size(); ++j) {
      const torch::Tensor& p = params_[b.params[j]];
      views_[b.params[j]] = b.buffer.narrow(0, b.offsets[j], p.numel()).view(p.sizes());
    }
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[k]));
    hook_keys_.push_back(accumulators_.back()->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, k](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          OnGradientAccumulated(k);
          return outputs;
        })));
  }
}

Reducer::~Reducer() {
  // The accumulators belong to the parameters and outlive this object: a hook left on
  // them would call into freed memory at the next backward.
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

std::string Reducer::Describe() const {
  std::ostringstream out;
  for (size_t i = 0; i < buckets_.size(); ++i)
    out << (i ? ", " : "") << buckets_[i].params.size() << " params/"
        << StrFormat("%.1f", buckets_[i].grad_numel * buckets_[i].buffer.element_size() / 1048576.0) << " MB";
  return out.str();
}

void Reducer::PrepareForBackward(bool stop_vote) {
  PrepareBuckets();
  torch::NoGradGuard no_grad;
  VoteSlot().fill_(stop_vote ? 1.0 : 0.0);
}

void Reducer::PrepareForBackward(const torch::Tensor& stop_vote) {
  PrepareBuckets();
  torch::NoGradGuard no_grad;
  VoteSlot().copy_(stop_vote.reshape({1}));
}

torch::Tensor Reducer::VoteSlot() const { return buckets_.front().buffer.narrow(0, buckets_.front().grad_numel, 1); }

void Reducer::PrepareBuckets() {
  if (in_step_) throw std::logic_error("Reducer: PrepareForBackward() twice without FinishBackward()");
  in_step_ = true;
  ++step_;
  next_to_launch_ = 0;
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.buffer.zero_();
    b.pending = b.params.size();
    b.work.reset();
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::Tensor& grad = params_[k].mutable_grad();
    if (!grad.defined() || !grad.is_same(views_[k])) grad = views_[k];
  }
}

void Reducer::OnGradientAccumulated(size_t param) {
  auto [bucket_index, slot] = slot_of_[param];
  Bucket& b = buckets_[bucket_index];
  if (!in_step_ || b.pending == 0)
    throw std::logic_error(StrFormat("Reducer: gradient of parameter %zu arrived outside a step or twice in step %ld",
                                     param, long(step_)));
  if (!params_[param].grad().is_same(views_[param]))
    throw std::logic_error(StrFormat("Reducer: parameter %zu's .grad was replaced during backward", param));
  if (accumulating_) return;
  if (--b.pending == 0 && options_.overlap) LaunchReady(false);
}

void Reducer::LaunchReady(bool force) {
  while (next_to_launch_ < buckets_.size()) {
    Bucket& b = buckets_[next_to_launch_];
    if (!force && b.pending > 0) return;
    // Parameters that got no gradient this step contribute the zeros of their view.
    Launch(b);
    ++next_to_launch_;
  }
}

void Reducer::Launch(Bucket& b) {
  std::string what = StrFormat("grad bucket %zu/%zu of step %ld", next_to_launch_ + 1, buckets_.size(), long(step_));
  b.wire = options_.fp16_compression ? b.buffer.to(torch::kHalf) : b.buffer;
  if (trace_) b.launched_us = TraceRecorder::NowUs();
  b.work = comm_.AllReduceAsync(b.wire, ReduceOp::kSum, std::move(what));
}

void Reducer::ContributeWithoutBackward() {
  for (auto& b : buckets_) b.pending = 0;  // FinishBackward launches what the buffers hold
}

void Reducer::FinishBackward() {
  if (!in_step_) throw std::logic_error("Reducer: FinishBackward() without PrepareForBackward()");
  launched_in_backward_ = next_to_launch_;
  LaunchReady(/*force=*/true);
  torch::NoGradGuard no_grad;
  const double world = comm_.size();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    b.work->Wait();
    if (trace_)
      trace_->Span("allreduce", TraceRecorder::kCommTrack, trace_step_, b.launched_us, TraceRecorder::NowUs(), int(i));
    if (options_.fp16_compression) b.buffer.copy_(b.wire);
    b.buffer.div_(world);
  }
  in_step_ = false;
}

torch::Tensor Reducer::StopVotes() const { return VoteSlot(); }

}  // namespace trainyard
