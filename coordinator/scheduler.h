// Which queued jobs start now, and on which ranks. Pure logic: no sockets, no clock
// (the caller passes `now`), no storage, so every rule is unit-tested directly.
//
// The rules, in order:
//   1. Jobs are considered by priority (higher first), then submission order.
//   2. Gang placement: a job needing k ranks starts only when k free ranks of one MPI
//      world, with the device kind it asks for, are available; it gets the lowest ones.
//   3. The first job in that order that cannot start is the head. It gets a
//      reservation: the world and the time at which, by the running jobs' estimated
//      ends, enough ranks will be free for it (EASY backfill).
//   4. A later job may start before the head (backfill) only if it fits in the free
//      ranks now and does not delay the head: it is estimated to end by the reservation
//      time, or it runs in another world, or the reserved world keeps enough ranks for
//      the head even with it running. A job without an estimate never delays a head.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trainyard {

struct WorkerRank {
  std::string world;  // MPI world id (one mpirun)
  int rank = 0;
  std::string device;        // "cpu" | "cuda"
  std::string job;           // running job id; empty when free
  double estimated_end = 0;  // of the running job, in the caller's time unit; 0 = unknown
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
  std::string job, world;
  std::vector<int> ranks;
  bool backfilled = false;
};

struct Reservation {
  std::string job, world;
  double start = 0;  // estimated; infinity when a running job has no estimate
};

struct ScheduleResult {
  std::vector<Placement> start;
  std::optional<Reservation> reservation;
  std::vector<std::string> unplaceable;  // need more ranks than any matching world has
};

class Scheduler {
 public:
  ScheduleResult Schedule(std::vector<QueuedJob> queue, const std::vector<WorkerRank>& ranks, double now) const;
};

}  // namespace trainyard
