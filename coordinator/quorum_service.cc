#include "coordinator/quorum_service.h"

#include <algorithm>
#include <utility>

namespace trainyard {
namespace {

std::string Joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

}  // namespace

QuorumService::QuorumService(Options options, uint64_t last_id) : options_(options), last_id_(last_id) {}

bool QuorumService::IsMember(const std::string& replica) const {
  return current_ &&
         std::find(current_->members.begin(), current_->members.end(), replica) != current_->members.end() &&
         gone_.count(replica) == 0;
}

bool QuorumService::Join(const std::string& replica, const ReplicaAddress& ring, int64_t committed_step, double now) {
  if (IsMember(replica)) {
    Replica& known = replicas_.at(replica);
    // The same process (its ring's address), at the quorum's step, that missed the news
    // of the quorum it is in: it is one of its members still.
    if (known.ring == ring && committed_step == current_->step - 1 && !votes_.count(replica)) {
      known.last_heard = now;
      return true;
    }
    gone_.insert(replica);  // a new process: the old one left the step
  }
  replicas_[replica] = Replica{ring, committed_step, now, now};
  DecideIfDue(now);
  return false;
}

VoteAnswer QuorumService::Beat(const std::string& replica, uint64_t quorum_id, double now) {
  const auto it = replicas_.find(replica);
  if (it == replicas_.end() || quorum_id > last_id_) return VoteAnswer::kFenced;
  // A joiner names no quorum; a member may name an older one while its decision is on
  // the way. One that names a quorum but is no member of the current one was left out.
  if (quorum_id != 0 && !IsMember(replica)) return VoteAnswer::kFenced;
  it->second.last_heard = now;
  return VoteAnswer::kCounted;
}

VoteAnswer QuorumService::Vote(const std::string& replica, uint64_t quorum_id, int64_t step, bool ok, double now) {
  if (!IsMember(replica) || quorum_id != current_->id || step != current_->step) return VoteAnswer::kFenced;
  replicas_.at(replica).last_heard = now;
  votes_[replica] = ok;
  DecideIfDue(now);
  return VoteAnswer::kCounted;
}

void QuorumService::RemoveReplica(const std::string& replica, double now) {
  if (IsMember(replica)) gone_.insert(replica);
  replicas_.erase(replica);
  DecideIfDue(now);
}

std::vector<StepDecision> QuorumService::Advance(double now) {
  for (auto it = replicas_.begin(); it != replicas_.end();) {  // joiners gone silent
    if (!IsMember(it->first) && !Live(it->second, now))
      it = replicas_.erase(it);
    else
      ++it;
  }
  if (current_) {
    DecideIfDue(now);
  } else if (!replicas_.empty() && !given_up_) {
    double first = now;
    int64_t furthest = 0;
    for (const auto& [name, r] : replicas_) {
      first = std::min(first, r.joined_at);
      furthest = std::max(furthest, r.committed_step);
    }
    const int joined = static_cast<int>(replicas_.size());
    if (joined >= options_.min_replicas && (joined >= options_.max_replicas || now - first >= options_.join_window_s)) {
      std::string why;
      if (auto formed = Form(furthest + 1, now, &why))
        decided_.push_back({0, formed->step, false, "a quorum formed", std::move(formed), now - first});
      else if (given_up_)
        decided_.push_back({0, furthest + 1, false, why, std::nullopt, now - first});
    }
  }
  return std::exchange(decided_, {});
}

void QuorumService::DecideIfDue(double now) {
  if (!current_) return;
  std::vector<std::string> silent;
  for (const std::string& member : current_->members)
    if (!votes_.count(member) && !gone_.count(member)) silent.push_back(member);
  const bool deadline = now - given_at_ >= options_.timeout_s;
  if (!silent.empty() && !deadline) return;
  std::vector<std::string> failed, gone(gone_.begin(), gone_.end());
  for (const auto& [member, ok] : votes_)
    if (!ok) failed.push_back(member);
  if (silent.empty() && gone.empty() && failed.empty()) return Decide(true, "", now);
  std::string why;
  if (!gone.empty()) why += "left the step: " + Joined(gone) + "; ";
  if (!silent.empty()) why += "no vote in time: " + Joined(silent) + "; ";
  if (!failed.empty()) why += "voted that it failed: " + Joined(failed) + "; ";
  why.resize(why.size() - 2);
  for (const std::string& member : silent) replicas_.erase(member);  // out, until it joins again
  Decide(false, why, now);
}

void QuorumService::Decide(bool commit, const std::string& why, double now) {
  const Quorum ended = *current_;
  const bool joiners_wait = MembershipChanged(ended, now);
  StepDecision decision{ended.id, ended.step, commit, why, std::nullopt, now - given_at_};
  const bool member_lost = !gone_.empty() || std::any_of(ended.members.begin(), ended.members.end(),
                                                         [&](const std::string& m) { return !replicas_.count(m); });
  if (commit) {
    for (const std::string& member : ended.members) replicas_.at(member).committed_step = ended.step;
    committed_ = ended.step;
  }
  current_.reset();
  votes_.clear();
  gone_.clear();
  retries_ = commit || member_lost ? 0 : retries_ + 1;
  if (retries_ >= kMaxRetries) {
    given_up_ = true;
    decision.why += "; the step failed " + std::to_string(retries_) + " times in a row with every member there";
  } else if (commit && !joiners_wait) {
    current_ = ended;  // the same quorum goes on to the next step
    current_->step = ended.step + 1;
    current_->heals.clear();
    given_at_ = now;
    decision.next = current_;
  } else {
    std::string lost;
    decision.next = Form(commit ? ended.step + 1 : ended.step, now, &lost);
    if (!lost.empty()) decision.why += (decision.why.empty() ? "" : "; ") + lost;
  }
  decided_.push_back(std::move(decision));
}

void QuorumService::Finish() {
  given_up_ = true;
  current_.reset();
}

bool QuorumService::MembershipChanged(const Quorum& quorum, double now) const {
  int live = 0;
  for (const auto& [name, r] : replicas_) live += Live(r, now);
  const int members = static_cast<int>(quorum.members.size());
  return live > members && members < options_.max_replicas;
}

std::optional<Quorum> QuorumService::Form(int64_t step, double now, std::string* why) {
  std::vector<std::pair<double, std::string>> live;
  int64_t furthest = 0;
  for (const auto& [name, r] : replicas_)
    if (Live(r, now)) {
      live.emplace_back(r.joined_at, name);
      furthest = std::max(furthest, r.committed_step);
    }
  if (static_cast<int>(live.size()) < options_.min_replicas) return std::nullopt;
  if (furthest < committed_) {  // healing from nobody would start again from an older state
    given_up_ = true;
    *why = "no live replica holds the state of step " + std::to_string(committed_) +
           " (the replicas that took it are gone); a later attempt resumes from the checkpoints";
    return std::nullopt;
  }
  std::sort(live.begin(), live.end());
  if (static_cast<int>(live.size()) > options_.max_replicas) live.resize(options_.max_replicas);
  Quorum q;
  q.id = ++last_id_;
  q.step = step;
  for (const auto& [joined, name] : live) q.members.push_back(name);
  std::sort(q.members.begin(), q.members.end());
  std::vector<std::string> current, behind;
  for (const std::string& member : q.members) {
    const Replica& r = replicas_.at(member);
    q.rings.push_back(r.ring);
    // The first step starts every member from the first one's state, as a run's ranks
    // start from rank 0's parameters: replicas made apart need not have drawn the same.
    const bool up_to_date = step == 1 ? member == q.members.front() : r.committed_step >= step - 1;
    (up_to_date ? current : behind).push_back(member);
  }
  for (size_t i = 0; i < behind.size() && !current.empty(); ++i)
    q.heals.push_back({current[i % current.size()], behind[i]});
  current_ = q;
  given_at_ = now;
  return q;
}

}  // namespace trainyard
