// An elastic replica's QuorumLink: the job's rank 0 reaches the coordinator's quorum
// (Note [Step quorum] in coordinator/quorum_service.h) through a QuorumChannel
// (job_relay.h): in a pool, the relay to the agent that leads it; in a Slurm job, its
// own agent. The agent signs each message as its rank's. Torch-free and wire-free in
// its header.
//
// Join sends a ReplicaJoin and waits for the first quorum that includes the replica,
// beating every `beat_s` meanwhile (a joiner silent for the quorum's timeout is dropped;
// a Fenced answer says it was, and it joins again). It gives up, nullopt, after
// `join_timeout_s`, or at once once the coordinator has said the steps are over.
// Vote sends a StepVote and waits up to `vote_timeout_s` for the decision on that step;
// a late answer to an earlier request is skipped. Fenced, or no answer in time, is a
// verdict that does not commit and names no next quorum: the replica joins again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "worker/elastic/quorum_link.h"
#include "worker/pool/job_relay.h"

namespace trainyard {

struct RelayQuorumOptions {
  std::string ring_host;  // where this replica's RingListener is reached
  int ring_port = 0;
  double beat_s = 1;
  double join_timeout_s = 300;
  double vote_timeout_s = 60;  // the quorum's timeout and then some: its decision comes by then
};

class RelayQuorumLink : public QuorumLink {
 public:
  RelayQuorumLink(QuorumChannel& channel, RelayQuorumOptions options)
      : channel_(channel), options_(std::move(options)) {}
  std::optional<QuorumView> Join(int64_t committed_step, const std::function<bool()>& stop) override;
  StepVerdict Vote(uint64_t id, int64_t step, bool ok, const std::string& why) override;
  // Whether the coordinator said the attempt's steps are over (they gave up).
  bool over() const { return over_; }

 private:
  void SendJoin(int64_t committed_step);

  QuorumChannel& channel_;
  RelayQuorumOptions options_;
  bool over_ = false;
};

}  // namespace trainyard
