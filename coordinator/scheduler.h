// Which queued jobs start now, and on which slots. Pure logic: no sockets, no clock
// (the caller passes `now`), no storage, so every rule is unit-tested directly.
//
// A slot is one pool agent (worker/pool/pool_agent.h), on some host. Slots are pooled by
// device kind, and any free slots of one kind form a job, whatever agents or hosts they
// are on: each job is its own mpirun over the hosts of its slots.
//
// The rules, in order:
//   1. Jobs are considered by priority (higher first), then submission order.
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
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
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
  std::vector<std::string> unplaceable;  // need more slots than the matching kind has
};

class Scheduler {
 public:
  ScheduleResult Schedule(std::vector<QueuedJob> queue, const std::vector<WorkerRank>& slots, double now) const;
};

}  // namespace trainyard
