// An attempt as the coordinator's loop follows it while it runs: its gang of slots, who
// has reported, and what preemption, a search or Slurm has asked of it. The store holds
// the durable part (coordinator/state_store.h); this is what the loop adds between
// messages, rebuilt from the store after a restart (Server::ReloadRunningAttempts).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "coordinator/rank_registry.h"
#include "coordinator/slurm.h"
#include "trainyard.pb.h"

namespace trainyard {

struct RunningAttempt {
  int64_t job = 0;
  int attempt = 0;
  // Of its job, for preemption and quotas.
  int priority = 0;
  std::string user;
  bool preemptible = true;
  // Note [Preemption]: the job it was stopped for, and when (on the listening clock).
  int64_t preempted_by = 0;
  double preempt_asked = 0;
  // Note [ASHA] in coordinator/search.h: the rung epoch its search stopped this trial at; 0: none.
  int search_stop_at = 0;
  std::vector<RankKey> slots;                // job rank order; slots[0] leads the job
  double started_at = 0, estimated_end = 0;  // wall clock
  double started_listening = 0;              // on the listening clock
  std::set<RankKey> finished;                // slots whose JobResult arrived
  std::set<RankKey> present;                 // slots seen running it (re-adoption)
  bool adopted = true;                       // false after a restart until every slot is back
  std::string summary_json;
  // --slurm (Note [Attempts as Slurm jobs]): its Slurm job, what squeue last said of it,
  // and whether it has started (the start grace counts from then).
  std::string slurm_job;
  SlurmJobState slurm_state;
  bool slurm_started = false;
  // What its rank 0 reported, when not a success: the attempt ends once Slurm says how
  // its job ended (SlurmLauncher::Follow), which names the cause (NODE_FAIL, TIMEOUT) and tells
  // a preemption or time limit (requeued free) from an scancel (counted).
  wire::Outcome reported = wire::OUTCOME_UNSPECIFIED;
  std::string reported_reason;
  double reported_at = 0;  // on the listening clock; a Slurm job not ended `grace_s` later is cancelled
  bool cancel_sent = false;
  // An elastic attempt (Note [Elastic finetune] in worker/jobs/trainer_elastic.cc): each
  // slot leads a replica of its own, a replica's end is its own, and the attempt ends once
  // every replica has ended: succeeded if one did.
  // A lost replica is replaced on a free slot (Note [Replacement replicas] in
  // pool_launcher.h): `slots` holds every slot the attempt's replicas have run on, and a
  // slot whose replica ended may take a new one, when it leaves `finished` again.
  bool elastic = false;
  int max_replicas = 0;                        // at full strength
  int replicas_started = 0;                    // numbers the next replica
  std::map<RankKey, int> replica_numbers;      // each slot's latest replica
  std::map<RankKey, double> replica_assigned;  // a replacement's Assign (listening clock)
  struct SlotFailures {
    int count = 0;  // replicas of the attempt that failed on the slot
    double at = 0;  // when the last did (the loop's clock)
  };
  std::map<RankKey, SlotFailures> slot_failures;
  // --slurm: each replica is a Slurm job of its own (its slot's world names it), and
  // this is what squeue last said of each.
  std::map<RankKey, SlurmJobState> replica_slurm_states;
  bool replica_succeeded = false;                             // one took every step
  bool replica_bad_input = false;                             // one ended on its job's bad input
  wire::Outcome replica_failure = wire::OUTCOME_UNSPECIFIED;  // how the first to end without success ended
  std::string first_replica_failure;                          // which it was, and why
};

// Which of `attempt`'s replicas (0.. in start order) runs on `slot`: its output file and
// run folder are that replica's.
int ReplicaNumber(const RunningAttempt& attempt, const RankKey& slot);
// How many of an elastic `attempt`'s replicas have not ended.
int LiveReplicas(const RunningAttempt& attempt);
// Whether the elastic `attempt` takes a replacement for a lost replica now (Note
// [Replacement replicas] in pool_launcher.h): it runs fewer than max_replicas, at least
// one, and it is not being stopped, and none of its replicas has taken the last step or
// ended on its job's bad input.
bool TakesReplacements(const RunningAttempt& attempt);
// How long after the last of `failures` replicas failed a place (a slot; under --slurm,
// the attempt) takes another: 2^(failures-1) s, at most 60 s; 0 before any failed.
double ReplacementBackoffS(int failures);

// A placement as the store keeps it: "<world>:<rank>,<world>:<rank>..." in job rank
// order (attempts.placement), and back into its slots; false for anything else.
std::string PlacementText(const std::vector<RankKey>& slots);
bool ParsePlacement(const std::string& text, std::vector<RankKey>* slots);

}  // namespace trainyard
