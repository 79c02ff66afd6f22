// The launcher of a worker pool (Note [Launchers] in launcher.h): a scheduling pass takes
// the queue with each owner's fair-share usage, the pool's slots and the running
// attempts to the Scheduler (coordinator/scheduler.h), records the attempts it places in
// one transaction, assigns them to their slots, and preempts the victims it names.
#pragma once

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/attempt_book.h"
#include "coordinator/launcher.h"
#include "coordinator/rank_registry.h"
#include "coordinator/scheduler.h"
#include "coordinator/state_store.h"

namespace trainyard {

class Metrics;  // common/metrics.h

// How the pool is shared (coordinator/scheduler.h, Note [Preemption]).
struct SchedulingPolicy {
  bool preemption = false;             // --preemption on
  double preempt_grace_s = 60;         // a victim not stopped by then has its mpirun ended
  double fairshare_half_life_h = 168;  // Note [Fair share]; 0: no decay
  int user_max_ranks = 0;              // 0: no limit
  int user_max_queued = 0;             // 0: no limit
  int user_max_priority = 0;           // the most a user key's job may ask (Note [Policy by role])
};

// Why each queued job waits, as of the last pass, by job id in decimal (the scheduler's
// ids): a pass replaces it whole.
using WaitReasons = std::unordered_map<std::string, std::string>;

// Note [Replacement replicas]
// An elastic attempt (Note [Elastic finetune] in worker/jobs/trainer_elastic.cc) that
// has lost a replica goes on with the others at once; the pool gives it a new one on a
// free slot once there is one, so the attempt regains its strength without a restart.
// Each scheduling pass, after the queue has been placed:
//  - replacements take only slots that no queued job waits for: none is placed while a
//    queued job waits for slots (Resources, Priority, FairShare, Reservation,
//    Preempting). A lost replica's slot is the pool's, and the attempt goes on without it.
//  - An attempt takes replacements while it runs fewer than max_replicas replicas and is
//    not being stopped (preempted, or its search trial stopped at a rung), and while none
//    of its replicas has taken the last step or ended on its job's bad input.
//  - Of the free slots of its replicas' device kind, it takes the one on which the
//    fewest of its replicas failed, then one on the host holding the fewest of its live
//    replicas, then by host, world and rank. A slot on which n of its replicas failed
//    takes another only 2^(n-1) s (at most 60 s) after the last failed, so a slot that
//    kills every replica does not take one each pass.
//  - The new replica has the attempt's next replica number (its run folder, replica-<n>,
//    and its output file), starts from nothing, joins the quorum, and is healed from a
//    live replica at the next step boundary (Note [Step quorum] in quorum_service.h).
class PoolLauncher : public Launcher {
 public:
  // What it reads and changes of the loop's state, all owned by the loop and outliving it.
  struct Sources {
    StateStore& store;
    const RankRegistry& ranks;
    AttemptBook& running;
    Metrics& metrics;      // the pass's time, as trainyard_scheduling_pass_seconds
    WaitReasons& waiting;  // what the dashboard and jobctl show of a queued job
    LaunchLoop& loop;
  };
  PoolLauncher(const SchedulingPolicy& policy, Sources sources) : policy_(policy), sources_(sources) {}

  void Schedule(double now) override;

 private:
  // Starts what the scheduler places of `queue` (not empty), preempts its victims and
  // notes why the rest waits.
  void Place(const std::vector<QueuedJob>& queue, double now);
  // The queue and the running jobs as the scheduler takes them.
  std::vector<QueuedJob> Queue(double now);
  std::vector<WorkerRank> Slots() const;
  std::vector<RunningJob> Running() const;
  // Note [Replacement replicas]: after a pass, free slots go to elastic attempts that
  // lost replicas, unless queued jobs wait for slots.
  void ReplaceLostReplicas(double now);
  bool QueueWaitsForSlots() const;
  // The free slot of `free` the replica that `attempt` lacks takes; free.end() if none may.
  std::vector<WorkerRank>::iterator SlotForReplica(const RunningAttempt& attempt, std::vector<WorkerRank>& free,
                                                   double now) const;
  // Starts the attempts of a pass's placements (one transaction, then the assignments).
  void StartAttempts(const std::vector<Placement>& placements, double now);
  // Records one attempt of `job` on its placement, inside the caller's transaction; false
  // (the job failed, said why) if its folder cannot be made.
  bool StartAttempt(const JobRecord& job, const Placement& placement, double now);

  SchedulingPolicy policy_;
  Sources sources_;
  Scheduler scheduler_;
  std::set<int64_t> reported_unplaceable_;  // jobs whose "waiting" event is written, until they start
};

// "12.3 s": a duration in the words of events and reasons.
std::string SecondsText(double s);

}  // namespace trainyard
