#include "worker/elastic/elastic_replica.h"

#include <string>
#include <utility>

namespace trainyard {

ElasticReplica::ElasticReplica(RingListener& listener, QuorumLink& link, ElasticModel model, RingOptions ring_options)
    : listener_(listener), link_(link), model_(std::move(model)), ring_options_(std::move(ring_options)) {}

int64_t ElasticReplica::RunUntil(int64_t committed, int64_t last) {
  const std::function<bool()> stop = model_.stop_requested ? model_.stop_requested : std::function<bool()>();
  std::optional<QuorumView> view = link_.Join(committed, stop);
  std::vector<float> gradient;  // reused: each step refills it
  while (view && committed < last) {
    if (model_.stop_requested && model_.stop_requested()) {
      stopped_ = true;
      break;
    }
    const bool ok = TakeStep(*view, &gradient);
    StepVerdict verdict = link_.Vote(view->id, view->step, ok, ok ? "" : last_failure_);
    if (verdict.commit) {
      model_.apply(view->step, gradient);
      committed = view->step;
    } else {
      ++retried_;
    }
    view = verdict.next ? std::move(verdict.next) : link_.Join(committed, stop);  // left out: join again
  }
  if (!view && stop && stop()) stopped_ = true;  // asked while it waited for a quorum
  ring_.reset();
  return committed;
}

bool ElasticReplica::TakeStep(const QuorumView& view, std::vector<float>* gradient) {
  try {
    if (!ring_ || ring_quorum_ != view.id) {  // a new membership: its own ring
      ring_.reset();
      RingOptions options = ring_options_;
      if (!view.secret.empty()) options.secret = view.secret;
      ring_ = std::make_unique<TcpRing>(listener_, view.rings, view.position, view.id, options);
      ring_quorum_ = view.id;
      ++rings_formed_;
    }
    Heal(view);
    gradient->assign(model_.gradient_size, 0.0f);
    model_.accumulate(view.step, view.position, static_cast<int>(view.rings.size()), gradient);
    ring_->AllReduceSum(gradient->data(), gradient->size());
    return true;
  } catch (const RingFailure& e) {
    ring_.reset();  // unusable now; the next quorum forms its own
    last_failure_ = e.what();
    return false;
  }
}

void ElasticReplica::Heal(const QuorumView& view) {
  for (const auto& [source, target] : view.heals) {
    std::vector<uint8_t> state;
    if (view.position == source) state = model_.save();
    uint64_t size = state.size();
    ring_->Broadcast(&size, sizeof size, source);
    if (size > model_.max_state_bytes)
      throw RingFailure(source, "the state to heal member " + std::to_string(target) + " from member " +
                                    std::to_string(source) + " is " + std::to_string(size) +
                                    " bytes, over the cap of " + std::to_string(model_.max_state_bytes));
    state.resize(size);
    ring_->Broadcast(state.data(), state.size(), source);
    if (view.position == target) model_.load(state);
  }
}

}  // namespace trainyard
