// Which queued jobs start now, and on which slots. Pure logic: no sockets, no clock
// (the caller passes `now`), no storage, so every rule is unit-tested directly.
//
// A slot is one pool agent (worker/pool/pool_agent.h), on some host. Slots are pooled by
// device kind, and any free slots of one kind form a job, whatever agents or hosts they
// are on: each job is its own mpirun over the hosts of its slots.
//
// The rules, in order:
//   1. Jobs are considered by priority (higher first), then fair share (the user with
//      less decayed usage first: Note [Fair share] in state_store.h), then submission
//      order. A job whose user already runs --user-max-ranks ranks (with it, more) is
//      passed over without blocking anyone.
//   2. Gang placement: a job needing k ranks starts only when k free slots of the device
//      kind it asks for (one kind, for "any") are available. It gets them from as few
//      hosts as can hold it: hosts with the most free slots first, then by name, and on
//      a host its slots in (world, rank) order. Job rank 0 is on the first host.
//   3. The first job in that order that cannot start is the head. It gets a
//      reservation: the device kind and the time at which, by the running jobs'
//      estimated ends, enough slots will be free for it (EASY backfill).
//   4. A later job may start before the head (backfill) only if it fits in the free
//      slots now and does not delay the head: it is estimated to end by the reservation
//      time, or it runs on another device kind, or the reserved kind keeps enough slots
//      for the head even with it running. A job without an estimate never delays a head.
//   5. Preemption (when on): a head that cannot start now stops the fewest running
//      preemptible jobs of strictly lower priority whose slots, with the free ones, let
//      it start. Of the device kinds it may run on, the one needing the fewest victims
//      wins (then the first by name). Within a kind, victims are taken largest first
//      (most ranks) until one more job suffices; of the jobs that suffice, the last
//      victim is the one of lowest priority, then fewest ranks, then most recently
//      started. So as few jobs stop as any choice allows, and a large job is spared
//      where a small one makes room. Jobs already stopping for an earlier preemption
//      count as freed for the job they were stopped for (for any of higher priority,
//      when that one is no longer queued): nothing more is stopped while they make room. A later job that
//      fits nowhere now may preempt too, in the same pass and by the same choice, from
//      the running jobs no earlier job stops, and without the free slots the head counts
//      on; at most kMaxPreemptingPerPass jobs do in one pass, so a wave of urgent jobs
//      makes room at once rather than one a pass. Only strictly lower priority is
//      preempted, and fair share never preempts, so two jobs can never preempt each
//      other back and forth.
// Every queued job that does not start gets a reason, in the manner of squeue's reason
// column: "<Code>: <detail>", Code one of Resources, Priority, FairShare, Reservation,
// QuotaRanks, Unplaceable, Preempting.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace trainyard {

// One pool slot, as the coordinator's registry knows it.
struct WorkerRank {
  std::string world;  // the agent's id
  int rank = 0;
  std::string host;
  std::string device;        // "cpu" | "cuda"
  std::string job;           // running job id; empty when free
  double estimated_end = 0;  // of the running job, in the caller's time unit; 0 = unknown
};

struct SlotRef {
  std::string world;
  int rank = 0;
  bool operator==(const SlotRef& other) const { return world == other.world && rank == other.rank; }
  bool operator<(const SlotRef& other) const { return world != other.world ? world < other.world : rank < other.rank; }
};

struct QueuedJob {
  std::string id;
  int priority = 0;
  int64_t order = 0;  // submission sequence number
  int ranks = 1;
  std::string device = "any";  // "cpu" | "cuda" | "any"
  double estimate = 0;         // expected run time; 0 = unknown
  std::string user;            // its owner
  double usage = 0;            // its owner's decayed rank-seconds (fair share)
};

// A running job, as preemption and quotas need it.
struct RunningJob {
  std::string id;
  int priority = 0;
  std::string user;
  bool preemptible = true;
  bool stopping = false;          // told to stop by an earlier preemption, not yet stopped
  int64_t started = 0;            // start order: larger is more recent
  std::string stopping_for = {};  // while stopping: the queued job it makes room for (empty: unknown)
};

// Rule 5: how many jobs behind the head may try to preempt in one pass (each try reads
// the running jobs of its device kinds).
constexpr int kMaxPreemptingPerPass = 32;

struct SchedulerPolicy {
  bool preemption = false;
  int user_max_ranks = 0;  // 0: no limit
};

struct Placement {
  std::string job;
  std::vector<SlotRef> slots;  // in job rank order
  bool backfilled = false;
};

struct Reservation {
  std::string job, device;
  double start = 0;  // estimated; infinity when a running job has no estimate
};

struct ScheduleResult {
  std::vector<Placement> start;
  std::optional<Reservation> reservation;
  std::vector<std::string> unplaceable;                  // need more slots than the matching kind has
  std::vector<std::string> preempt;                      // running jobs to stop (rule 5)
  std::vector<std::string> preempt_for;                  // the queued job each of them makes room for
  std::unordered_map<std::string, std::string> waiting;  // why each queued job that does not start waits
};

class Scheduler {
 public:
  // `running` describes the jobs the slots name (any not listed: priority 0, not
  // preemptible, no user).
  ScheduleResult Schedule(const std::vector<QueuedJob>& queue, const std::vector<WorkerRank>& slots, double now,
                          const std::vector<RunningJob>& running = {}, const SchedulerPolicy& policy = {}) const;
};

}  // namespace trainyard
