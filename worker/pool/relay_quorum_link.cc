#include "worker/pool/relay_quorum_link.h"

#include <algorithm>
#include <utility>

#include "common/clock.h"
#include "trainyard.pb.h"

namespace trainyard {
namespace {

QuorumView ViewOf(const wire::QuorumInfo& info) {
  QuorumView view;
  view.id = info.id();
  view.step = info.step();
  view.position = info.position();
  for (const wire::ReplicaRing& member : info.members()) view.rings.push_back({member.host(), member.port()});
  for (const wire::RingHeal& heal : info.heals()) view.heals.emplace_back(heal.source(), heal.target());
  view.secret = info.ring_secret();
  return view;
}

}  // namespace

void RelayQuorumLink::SendJoin(int64_t committed_step) {
  wire::Envelope e;
  wire::ReplicaJoin* join = e.mutable_replica_join();
  join->set_ring_host(options_.ring_host);
  join->set_ring_port(options_.ring_port);
  join->set_committed_step(committed_step);
  channel_.SendQuorumMessage(e);
}

std::optional<QuorumView> RelayQuorumLink::Join(int64_t committed_step, const std::function<bool()>& stop) {
  constexpr double kStopCheckS = 0.5;
  if (over_) return std::nullopt;
  const auto start = Clock::now();
  SendJoin(committed_step);
  auto last_beat = Clock::now();
  while (SecondsSince(start) < options_.join_timeout_s) {
    if (stop && stop()) return std::nullopt;
    const double wait = std::max(0.0, std::min({options_.beat_s - SecondsSince(last_beat),
                                                options_.join_timeout_s - SecondsSince(start), kStopCheckS}));
    if (const std::optional<wire::Envelope> answer = channel_.AwaitQuorumAnswer(wait)) {
      if (answer->has_fenced()) {  // dropped as a silent joiner, or a beat named an old quorum
        SendJoin(committed_step);
        continue;
      }
      const wire::StepDecision& d = answer->step_decision();
      over_ = over_ || d.over();
      if (over_) return std::nullopt;
      if (d.quorum_id() == 0 && d.has_next()) return ViewOf(d.next());
      continue;  // a late decision on a step this replica no longer waits for
    }
    if (SecondsSince(last_beat) >= options_.beat_s) {
      wire::Envelope beat;
      beat.mutable_replica_beat()->set_quorum_id(0);
      channel_.SendQuorumMessage(beat);
      last_beat = Clock::now();
    }
  }
  return std::nullopt;
}

StepVerdict RelayQuorumLink::Vote(uint64_t id, int64_t step, bool ok, const std::string& why) {
  wire::Envelope e;
  wire::StepVote* vote = e.mutable_step_vote();
  vote->set_quorum_id(id);
  vote->set_step(step);
  vote->set_ok(ok);
  vote->set_why(why);
  channel_.SendQuorumMessage(e);
  const auto start = Clock::now();
  for (double left = options_.vote_timeout_s; left > 0; left = options_.vote_timeout_s - SecondsSince(start)) {
    const std::optional<wire::Envelope> answer = channel_.AwaitQuorumAnswer(left);
    if (!answer) break;
    if (answer->has_fenced()) {
      if (answer->fenced().quorum_id() != id) continue;
      return {false, std::nullopt, answer->fenced().why()};
    }
    const wire::StepDecision& d = answer->step_decision();
    over_ = over_ || d.over();
    if (d.quorum_id() != id || d.step() != step) {
      if (over_) return {false, std::nullopt, d.why()};
      continue;
    }
    StepVerdict verdict{d.commit(), std::nullopt, d.why()};
    if (d.has_next() && !over_) verdict.next = ViewOf(d.next());
    return verdict;
  }
  return {false, std::nullopt,
          "no decision on step " + std::to_string(step) + " from the coordinator within " +
              std::to_string(static_cast<int>(options_.vote_timeout_s)) + " s"};
}

}  // namespace trainyard
