#include "coordinator/elastic_quorums.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/curve/curve_keys.h"
#include "coordinator/state_store.h"

namespace trainyard {
namespace {

constexpr size_t kMaxHostBytes = 253;  // a DNS name's
constexpr size_t kMaxWhyBytes = 512;   // of a vote's reason, in an event

bool IsHostText(const std::string& host) {
  if (host.empty() || host.size() > kMaxHostBytes) return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == ':';
  });
}

std::string AttemptText(int64_t job, int attempt) {
  return "job " + std::to_string(job) + " attempt " + std::to_string(attempt);
}

bool IsMemberOf(const Quorum& quorum, const std::string& replica) {
  return std::find(quorum.members.begin(), quorum.members.end(), replica) != quorum.members.end();
}

// "quorum 4 formed for step 12: a, b (b healed from a)"
std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

std::string Formed(const Quorum& quorum) {
  std::string text = "quorum " + std::to_string(quorum.id) + " formed for step " + std::to_string(quorum.step) + ": ";
  for (size_t i = 0; i < quorum.members.size(); ++i) text += (i ? ", " : "") + quorum.members[i];
  for (size_t i = 0; i < quorum.heals.size(); ++i)
    text += (i ? "; " : " (") + quorum.heals[i].target + " healed from " + quorum.heals[i].source +
            (i + 1 == quorum.heals.size() ? ")" : "");
  return text;
}

// What the job's events say of `decision`; "" for a step that committed in the same quorum.
std::string EventText(const StepDecision& decision, bool over) {
  const std::string took = " after " + Seconds(decision.took_s);
  if (decision.quorum_id == 0)
    return decision.next ? Formed(*decision.next) + ", " + Seconds(decision.took_s) + " after the first join"
           : over        ? decision.why + "; the steps give up"
                         : "";
  std::string text;
  if (!decision.commit)
    text = "step " + std::to_string(decision.step) + " of quorum " + std::to_string(decision.quorum_id) +
           " did not commit" + took + " (" + decision.why + ")";
  if (decision.next && decision.next->id != decision.quorum_id)
    text += (text.empty() ? "" : "; ") + Formed(*decision.next);
  else if (!decision.next && !text.empty())
    text += over ? "; the steps give up" : "; no quorum: fewer replicas than min_replicas";
  return text;
}

}  // namespace

void ElasticQuorums::Open(int64_t job, int attempt, QuorumService::Options options) {
  open_.erase({job, attempt});
  open_.emplace(std::piecewise_construct, std::forward_as_tuple(job, attempt),
                std::forward_as_tuple(options, store_.LastQuorumId(job), NewSecretToken()));
}

void ElasticQuorums::Close(int64_t job, int attempt) { open_.erase({job, attempt}); }

ElasticQuorums::OpenAttempt* ElasticQuorums::Find(int64_t job, int attempt) {
  const auto it = open_.find({job, attempt});
  return it == open_.end() ? nullptr : &it->second;
}

std::string ElasticQuorums::Join(const std::string& identity, const std::string& replica, const wire::ReplicaJoin& join,
                                 double now) {
  OpenAttempt* open = Find(join.job_id(), join.attempt());
  if (!open) return AttemptText(join.job_id(), join.attempt()) + " has no elastic quorum (it is not elastic, or over)";
  if (!IsHostText(join.ring_host()))
    return "a replica's ring host must be a host name or address of at most 253 characters";
  if (join.ring_port() < 1 || join.ring_port() > 65535) return "a replica's ring port must be in 1..65535";
  if (join.committed_step() < 0) return "a replica's committed step must be 0 or more";
  const Key key{join.job_id(), join.attempt()};
  if (open->service.given_up()) {  // no quorum forms again: the replica stops
    messages_.push_back({identity, DecisionFor(key, *open, StepDecision{}, replica)});
    return "";
  }
  if (open->service.Join(replica, {join.ring_host(), join.ring_port()}, join.committed_step(), now)) {
    const Quorum& current = *open->service.current();  // it is in it: told again
    messages_.push_back(
        {identity, DecisionFor(key, *open, StepDecision{0, current.step, false, "", current}, replica)});
    return "";
  }
  open->waiting[replica] = Waiting{identity, false, 0, 0};
  Settle(key, *open, now);
  return "";
}

std::string ElasticQuorums::Beat(const std::string& identity, const std::string& replica, const wire::ReplicaBeat& beat,
                                 double now) {
  OpenAttempt* open = Find(beat.job_id(), beat.attempt());
  if (!open) return AttemptText(beat.job_id(), beat.attempt()) + " has no elastic quorum (it is not elastic, or over)";
  if (open->service.Beat(replica, beat.quorum_id(), now) == VoteAnswer::kFenced)
    Fence(identity, {beat.job_id(), beat.attempt()}, beat.quorum_id(),
          replica + " is in no quorum of this coordinator's (quorum " + std::to_string(beat.quorum_id()) +
              " is an old view): it joins again");
  return "";
}

std::string ElasticQuorums::Vote(const std::string& identity, const std::string& replica, const wire::StepVote& vote,
                                 double now) {
  const Key key{vote.job_id(), vote.attempt()};
  OpenAttempt* open = Find(key.first, key.second);
  if (!open) return AttemptText(key.first, key.second) + " has no elastic quorum (it is not elastic, or over)";
  if (open->service.Vote(replica, vote.quorum_id(), vote.step(), vote.ok(), now) == VoteAnswer::kFenced) {
    open->waiting.erase(replica);
    Fence(identity, key, vote.quorum_id(),
          replica + "'s vote on step " + std::to_string(vote.step()) + " of quorum " +
              std::to_string(vote.quorum_id()) + " names no step it takes part in now: it joins again");
    return "";
  }
  open->waiting[replica] = Waiting{identity, true, vote.quorum_id(), vote.step()};
  if (!vote.ok() && !vote.why().empty())
    events_.push_back({key.first, replica + " failed step " + std::to_string(vote.step()) + ": " +
                                      vote.why().substr(0, kMaxWhyBytes)});
  Settle(key, *open, now);
  return "";
}

void ElasticQuorums::ReplicaGone(const std::string& replica, double now) {
  for (auto& [key, open] : open_) {
    open.waiting.erase(replica);
    open.service.RemoveReplica(replica, now);
    Settle(key, open, now);
  }
}

void ElasticQuorums::Finish(int64_t job, int attempt) {
  OpenAttempt* open = Find(job, attempt);
  if (!open || open->service.given_up()) return;
  open->service.Finish();
  Answer({job, attempt}, *open, StepDecision{});
}

void ElasticQuorums::Advance(double now) {
  for (auto& [key, open] : open_) Settle(key, open, now);
}

void ElasticQuorums::Settle(const Key& key, OpenAttempt& open, double now) {
  for (const StepDecision& decision : open.service.Advance(now)) {
    if (decision.next && decision.next->id > open.kept_id) {  // kept before anyone hears of it
      store_.KeepQuorumId(key.first, decision.next->id);
      open.kept_id = decision.next->id;
    }
    if (std::string text = EventText(decision, open.service.given_up()); !text.empty())
      events_.push_back({key.first, std::move(text)});
    Answer(key, open, decision);
  }
}

void ElasticQuorums::Answer(const Key& key, OpenAttempt& open, const StepDecision& decision) {
  const bool over = open.service.given_up();
  for (auto it = open.waiting.begin(); it != open.waiting.end();) {
    const std::string& replica = it->first;
    const Waiting& waiting = it->second;
    const bool decided = waiting.vote && decision.quorum_id != 0 && waiting.quorum_id == decision.quorum_id &&
                         waiting.step == decision.step;
    const bool admitted = !waiting.vote && decision.next && IsMemberOf(*decision.next, replica);
    if (!decided && !admitted && !over) {
      ++it;
      continue;
    }
    StepDecision answer = decision;
    if (!decided) answer = StepDecision{0, decision.next ? decision.next->step : 0, false, "", decision.next};
    messages_.push_back({waiting.identity, DecisionFor(key, open, answer, replica)});
    it = open.waiting.erase(it);
  }
}

void ElasticQuorums::Fence(const std::string& identity, const Key& key, uint64_t quorum_id, const std::string& why) {
  wire::Envelope e;
  wire::Fenced* fenced = e.mutable_fenced();
  fenced->set_job_id(key.first);
  fenced->set_attempt(key.second);
  fenced->set_quorum_id(quorum_id);
  fenced->set_why(why);
  messages_.push_back({identity, std::move(e)});
}

wire::Envelope ElasticQuorums::DecisionFor(const Key& key, const OpenAttempt& open, const StepDecision& decision,
                                           const std::string& replica) const {
  wire::Envelope e;
  wire::StepDecision* d = e.mutable_step_decision();
  d->set_job_id(key.first);
  d->set_attempt(key.second);
  d->set_quorum_id(decision.quorum_id);
  d->set_step(decision.step);
  d->set_commit(decision.commit);
  d->set_why(decision.why);
  d->set_over(open.service.given_up());
  if (!decision.next || !IsMemberOf(*decision.next, replica)) return e;
  const Quorum& q = *decision.next;
  wire::QuorumInfo* info = d->mutable_next();
  info->set_id(q.id);
  info->set_step(q.step);
  info->set_ring_secret(open.secret);
  for (size_t i = 0; i < q.members.size(); ++i) {
    if (q.members[i] == replica) info->set_position(static_cast<int>(i));
    wire::ReplicaRing* ring = info->add_members();
    ring->set_name(q.members[i]);
    ring->set_host(q.rings[i].host);
    ring->set_port(q.rings[i].port);
  }
  auto position = [&q](const std::string& name) {
    return static_cast<int>(std::find(q.members.begin(), q.members.end(), name) - q.members.begin());
  };
  for (const HealPair& heal : q.heals) {
    wire::RingHeal* h = info->add_heals();
    h->set_source(position(heal.source));
    h->set_target(position(heal.target));
  }
  return e;
}

}  // namespace trainyard
