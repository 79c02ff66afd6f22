// The attempts the coordinator believes are running, by job id, at most one per job: what
// the loop knows of them between messages beyond the store's open attempts (who has
// reported, what preemption, a search or Slurm asked). The Server opens and ends them
// (Server::EndJobsAttempt is the one way out); the book answers which attempt a slot
// belongs to, for the scheduler and for every message a rank sends.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "coordinator/running_attempt.h"

namespace trainyard {

class AttemptBook {
 public:
  using Map = std::map<int64_t, RunningAttempt>;

  // `job`'s running attempt; null if none.
  RunningAttempt* Find(int64_t job);
  const RunningAttempt* Find(int64_t job) const;
  // `job`'s running attempt if it is attempt number `attempt`; null for an ended or another one.
  RunningAttempt* Find(int64_t job, int attempt);
  // Keeps `attempt` as its job's running one, replacing any other.
  RunningAttempt& Add(RunningAttempt attempt);
  // Takes `job`'s running attempt out; nullopt if none.
  std::optional<RunningAttempt> Remove(int64_t job);
  // The attempt `slot` is one of the slots of and has not sent its result for; null if none.
  RunningAttempt* Awaiting(const RankKey& slot);
  // Awaiting's answer for every slot that has one, in one walk.
  std::map<RankKey, const RunningAttempt*> AwaitingBySlot() const;
  // Every attempt's start grace counts afresh from `listened` (after a stall of the loop:
  // Note [Listening time]).
  void RestartGraces(double listened);

  const Map& all() const { return attempts_; }
  Map::iterator begin() { return attempts_.begin(); }
  Map::iterator end() { return attempts_.end(); }
  Map::const_iterator begin() const { return attempts_.begin(); }
  Map::const_iterator end() const { return attempts_.end(); }
  size_t size() const { return attempts_.size(); }

 private:
  Map attempts_;
};

}  // namespace trainyard
