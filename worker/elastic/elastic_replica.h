// Note [Elastic steps]
// One replica's side of an elastic job's steps (the quorum's side is Note [Step quorum]
// in coordinator/quorum_service.h; the ring is Note [The replica ring] in tcp_ring.h).
// A replica joins, is given a quorum, and for each step:
//  1. forms the quorum's ring if the quorum's id is new to it (a new membership);
//  2. if the quorum names heals, passes each source's state along the ring (the state's
//     size, then its bytes); the member to be healed loads it: the weights, optimizer
//     state and step it would have had, from a live peer, not a checkpoint;
//  3. computes its share of the step's gradient, as member i of q (the model decides
//     the share: the trainer's is examples [n i / q, n (i+1) / q) of the step's global
//     batch of n, weighted by 1/n), and sums the shares over the ring: the step's
//     gradient, the same bits on every member;
//  4. votes: ok if 3 completed, failed if the ring broke (a member died, froze or was
//     cut off) or the ring could not be formed;
//  5. applies the gradient only if the decision commits; otherwise it drops it and
//     takes the step again in the quorum the decision gives.
// So the global batch, and with it the learning rate and the schedule, stays what the
// job asked whatever the number of replicas: fewer replicas each take a larger share
// and the step takes longer. No example of a committed step is lost or counted twice,
// since nothing of a step that does not commit is kept.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/elastic/quorum_link.h"
#include "worker/elastic/tcp_ring.h"

namespace trainyard {

// What the replica trains: the caller's model, seen through these.
struct ElasticModel {
  size_t gradient_size = 0;  // floats
  // Adds to `sum` member `position` of `members`' share of step `step`'s gradient: the
  // members' shares add up to the step's gradient, whatever their number. (The vector
  // may carry more than gradients, such as the step's loss sums: it is summed as a whole.)
  std::function<void(int64_t step, int position, int members, std::vector<float>* sum)> accumulate;
  // Applies the step's gradient (the shares' sum); only for a committed step.
  std::function<void(int64_t step, const std::vector<float>& gradient)> apply;
  // The replica's whole state (weights, optimizer, RNG, the step it has committed), and
  // its loading on a replica that is healed.
  std::function<std::vector<uint8_t>()> save;
  std::function<void(const std::vector<uint8_t>&)> load;
  // The largest state a heal may pass: every member holds it whole on its way round the
  // ring, and its size comes from a peer. A larger one fails the step on every member,
  // naming the cap (and, failing again each retry, ends the job's steps).
  uint64_t max_state_bytes = uint64_t(8) << 30;
  // Asked before each step (none: never): true makes the replica leave its quorum there,
  // with every step it took committed or dropped (a cancel, a preemption).
  std::function<bool()> stop_requested;
};

class ElasticReplica {
 public:
  ElasticReplica(RingListener& listener, QuorumLink& link, ElasticModel model, RingOptions ring_options);
  // Takes steps until step `last` has committed (Note [Elastic steps]); the step it had
  // committed before comes from `committed`. Returns the last step committed, which is
  // less than `last` if no quorum includes the replica any more, or if it was asked to
  // stop (stopped()).
  int64_t RunUntil(int64_t committed, int64_t last);
  // Steps this replica voted on that did not commit, and rings it formed.
  int retried() const { return retried_; }
  bool stopped() const { return stopped_; }
  int rings_formed() const { return rings_formed_; }
  // Why the last step that failed here failed.
  const std::string& last_failure() const { return last_failure_; }

 private:
  // Steps 1-3 of the Note for the quorum `view`; false if the ring failed.
  bool TakeStep(const QuorumView& view, std::vector<float>* gradient);
  void Heal(const QuorumView& view);

  RingListener& listener_;
  QuorumLink& link_;
  ElasticModel model_;
  RingOptions ring_options_;
  std::unique_ptr<TcpRing> ring_;
  uint64_t ring_quorum_ = 0;
  int retried_ = 0, rings_formed_ = 0;
  bool stopped_ = false;
  std::string last_failure_;
};

}  // namespace trainyard
