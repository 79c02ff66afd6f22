// The Server's side of elastic attempts' quorums (Note [Step quorum] in
// quorum_service.h; the messages and their answers in elastic_quorums.h). A replica is
// named after the rank that speaks for it, and only a rank the store placed the attempt
// on, holding its rank token, may speak for one.
#include <algorithm>
#include <string>
#include <vector>

#include "coordinator/server.h"

namespace trainyard {
namespace {

std::string ReplicaName(const std::string& world, int rank) { return world + ":" + std::to_string(rank); }

}  // namespace

bool Server::IsRankOfAttempt(int64_t job, int attempt, const std::string& world, int rank) const {
  for (const AttemptRecord& a : store_->Attempts(job)) {
    std::vector<RankKey> slots;
    if (a.attempt == attempt && ParsePlacement(a.placement, &slots))
      return std::find(slots.begin(), slots.end(), RankKey{world, rank}) != slots.end();
  }
  return false;
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

void Server::SendQuorumAnswers() {
  for (const QuorumEvent& event : quorums_->TakeEvents()) store_->AddEvent(event.job, event.text, Now());
  for (const QuorumMessage& message : quorums_->TakeMessages()) Send(message.identity, message.message);
}

}  // namespace trainyard
