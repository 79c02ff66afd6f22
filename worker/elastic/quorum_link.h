// What a replica of an elastic job hears from the quorum service (Note [Step quorum]
// in coordinator/quorum_service.h) and how it reaches it: plain structs and an
// interface, with no wire and no ring behind them, so that both the replica's steps
// (elastic_replica.h) and the links that carry them (worker/pool/relay_quorum_link.h)
// can use them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/elastic/tcp_ring.h"

namespace trainyard {

// A quorum as a replica is given it.
struct QuorumView {
  uint64_t id = 0;
  int64_t step = 0;
  int position = -1;                       // this replica's place in the ring
  std::vector<RingMember> rings;           // every member's ring address, ring order
  std::vector<std::pair<int, int>> heals;  // (source, target) positions, in order
  std::string secret;                      // the attempt's ring secret; "": the replica's own
};

// A decision on a step, as a replica is told it.
struct StepVerdict {
  bool commit = false;
  std::optional<QuorumView> next;  // none: no quorum includes this replica now (it must join again)
  std::string why;
};

// How a replica reaches the quorum service: over the coordinator's wire in a job
// (through its agent: worker/pool/relay_quorum_link.h), in process in tests. Both calls
// block until answered or until the link's deadline, past which Join gives nullopt and
// Vote a verdict that does not commit, with no next quorum.
class QuorumLink {
 public:
  virtual ~QuorumLink() = default;
  // Joins, having committed `committed_step`; the first quorum that includes it, or
  // nullopt if none will (the job gave up, or its time ran out), or once `stop` (if set,
  // asked at least every half second while it waits) says the replica is to stop.
  virtual std::optional<QuorumView> Join(int64_t committed_step, const std::function<bool()>& stop) = 0;
  // Votes on `step` of quorum `id` (`why`: why not ok, for the job's events); the decision.
  virtual StepVerdict Vote(uint64_t id, int64_t step, bool ok, const std::string& why) = 0;
};

}  // namespace trainyard
