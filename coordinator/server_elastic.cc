// The Server's side of elastic attempts' quorums (Note [Step quorum] in
// quorum_service.h; the messages and their answers in elastic_quorums.h). A replica is
// named after the rank that speaks for it, and only a rank the store placed the attempt
// on, holding its rank token, may speak for one.
#include <algorithm>
#include <optional>
#include <string>

#include "coordinator/server.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

std::string ReplicaName(const std::string& world, int rank) { return world + ":" + std::to_string(rank); }

}  // namespace

// The running attempt's slots, in memory: a replica's every vote asks, and a message for
// an attempt that has ended has no quorum to go to anyway.
bool Server::IsRankOfAttempt(int64_t job, int attempt, const std::string& world, int rank) const {
  const RunningAttempt* running = running_.Find(job);
  return running && running->attempt == attempt &&
         std::count(running->slots.begin(), running->slots.end(), RankKey{world, rank}) > 0;
}

bool Server::AdmitReplicaMessage(const std::string& identity, const ReplicaSender& sender, const char* what) {
  if (!Authenticated(identity, sender.world, sender.rank, sender.token, what)) return false;
  if (IsRankOfAttempt(sender.job, sender.attempt, sender.world, sender.rank)) return true;
  Refuse(identity, std::string(what) + " for job " + std::to_string(sender.job) + " attempt " +
                       std::to_string(sender.attempt) + " from a rank that is not one of its ranks");
  return false;
}

void Server::AnswerReplica(const std::string& identity, const std::string& refusal) {
  if (!refusal.empty()) return Refuse(identity, refusal);
  SendQuorumAnswers();
}

void Server::OnReplicaJoin(const std::string& identity, const wire::ReplicaJoin& m) {
  const ReplicaSender sender{m.job_id(), m.attempt(), m.world(), m.world_rank(), m.rank_token()};
  if (!AdmitReplicaMessage(identity, sender, "a replica's join")) return;
  AnswerReplica(identity, quorums_->Join(identity, ReplicaName(m.world(), m.world_rank()), m, listening_.Now()));
}

void Server::OnReplicaBeat(const std::string& identity, const wire::ReplicaBeat& m) {
  const ReplicaSender sender{m.job_id(), m.attempt(), m.world(), m.world_rank(), m.rank_token()};
  if (!AdmitReplicaMessage(identity, sender, "a replica's beat")) return;
  AnswerReplica(identity, quorums_->Beat(identity, ReplicaName(m.world(), m.world_rank()), m, listening_.Now()));
}

void Server::OnStepVote(const std::string& identity, const wire::StepVote& m) {
  const ReplicaSender sender{m.job_id(), m.attempt(), m.world(), m.world_rank(), m.rank_token()};
  if (!AdmitReplicaMessage(identity, sender, "a step vote")) return;
  AnswerReplica(identity, quorums_->Vote(identity, ReplicaName(m.world(), m.world_rank()), m, listening_.Now()));
}

void Server::ReplicaGone(const RankKey& key) {
  quorums_->ReplicaGone(ReplicaName(key.first, key.second), listening_.Now());
  SendQuorumAnswers();
}

void Server::OpenQuorumIfElastic(RunningAttempt* attempt) {
  const std::optional<ElasticOptions> elastic = store_->ElasticOptionsOf(attempt->job);
  if (!elastic) return;
  attempt->elastic = true;
  attempt->max_replicas = elastic->max_replicas;
  attempt->replicas_started = static_cast<int>(attempt->slots.size());
  QuorumService::Options options;
  options.min_replicas = elastic->min_replicas;
  options.max_replicas = elastic->max_replicas;
  options.timeout_s = elastic->timeout_s;
  options.join_window_s = elastic->join_window_s;
  quorums_->Open(attempt->job, attempt->attempt, options);
}

void Server::ReplicaEnded(RunningAttempt& attempt, const RankKey& slot, wire::Outcome end, const std::string& message,
                          const std::string& summary_json) {
  if (!attempt.finished.insert(slot).second) return;
  launcher_->ReplicaEnded(attempt, slot, end);
  if (end == wire::OUTCOME_SUCCEEDED) {
    // It has taken every step: the quorum's other members have too, and a replica still
    // joining has none left to take.
    if (attempt.summary_json.empty()) attempt.summary_json = summary_json;
    attempt.replica_succeeded = true;
    quorums_->Finish(attempt.job, attempt.attempt);
    SendQuorumAnswers();
  } else {
    attempt.replica_bad_input = attempt.replica_bad_input || end == wire::OUTCOME_BAD_INPUT;
    RunningAttempt::SlotFailures& failures = attempt.slot_failures[slot];
    ++failures.count;
    failures.at = Now();
    if (attempt.replica_failure == wire::OUTCOME_UNSPECIFIED) {
      attempt.replica_failure = end;
      attempt.first_replica_failure = DescribeRank(slot) + ": " + message;
    }
    store_->AddEvent(attempt.job, "replica " + DescribeRank(slot) + " ended (" + OutcomeName(end) + "): " + message,
                     Now());
    ReplicaGone(slot);
  }
  if (attempt.finished.size() < attempt.slots.size()) return;
  if (attempt.replica_succeeded) return SucceedAttempt(attempt);
  if (attempt.search_stop_at != 0) return EndStoppedTrial(attempt.job, attempt.search_stop_at);
  const std::string reason = "every replica ended without success; the first: " + attempt.first_replica_failure;
  if (attempt.preempted_by != 0)
    return FailAttempt(attempt.job, "preempted by job " + std::to_string(attempt.preempted_by) + ": " + reason,
                       Retry::kFree);
  const wire::Outcome how = attempt.replica_failure;
  FailAttempt(attempt.job, reason,
              how == wire::OUTCOME_BAD_INPUT   ? Retry::kNever
              : how == wire::OUTCOME_PREEMPTED ? Retry::kFree
                                               : Retry::kCounted);
}

// Its agent was lost (a cut link, a stall) and registers again with the replica still
// running: the replica is the attempt's again. Its quorum let it go, so its next message
// names an old view, is fenced, and it joins again to be healed; nothing it did while
// away commits.
void Server::ReplicaBack(RunningAttempt& attempt, const RankKey& slot) {
  if (attempt.replica_succeeded || !quorums_->IsOpen(attempt.job, attempt.attempt)) return;
  attempt.finished.erase(slot);
  store_->AddEvent(attempt.job,
                   "replica " + std::to_string(ReplicaNumber(attempt, slot)) + " on " + DescribeRank(slot) +
                       " is back after its agent was lost; it joins the quorum again",
                   Now());
}

// A result sent again after a replacement started on the slot (its first ack lost) is
// the ended replica's, not the running one's. After a coordinator restart the numbers
// are not known, and any result is the slot's.
bool Server::IsEarlierReplica(const RunningAttempt& attempt, const RankKey& slot, int replica) const {
  const auto it = attempt.replica_numbers.find(slot);
  return it != attempt.replica_numbers.end() && replica < it->second;
}

void Server::AddReplica(RunningAttempt& attempt, const RankKey& slot, double now) {
  const std::optional<JobRecord> job = store_->Find(attempt.job);
  if (!job) return;
  const bool again = attempt.finished.count(slot) > 0;  // the slot's last replica ended
  std::vector<RankKey> slots = attempt.slots;
  if (!again) slots.push_back(slot);
  const int replica = attempt.replicas_started;
  StateStore::Transaction transaction(*store_);  // kept before the attempt changes
  if (!again) store_->SetPlacement(attempt.job, attempt.attempt, PlacementText(slots));
  store_->AddEvent(attempt.job,
                   "replica " + std::to_string(replica) + " starts on " + DescribeRank(slot) +
                       " in place of a lost one; it joins the quorum and is healed from a live replica",
                   now);
  transaction.Commit();
  attempt.finished.erase(slot);
  attempt.slots = std::move(slots);
  attempt.replica_numbers[slot] = replica;
  attempt.replica_assigned[slot] = listening_.Now();  // its start grace counts from now
  ++attempt.replicas_started;
  if (const RankEntry* rank = ranks_->Find(slot); rank && rank->job == 0) SendAssign(*job, attempt, slot);
}

void Server::ReplicaLost(RunningAttempt& attempt, const RankKey& slot, const std::string& reason) {
  ReplicaEnded(attempt, slot, wire::OUTCOME_FAILED, reason, "");
}

void Server::SendQuorumAnswers() {
  for (const QuorumEvent& event : quorums_->TakeEvents()) store_->AddEvent(event.job, event.text, Now());
  for (const QuorumMessage& message : quorums_->TakeMessages()) Send(message.identity, message.message);
}

}  // namespace trainyard
