// The attempts the coordinator believes are running, by job id, at most one per job: what
// the loop knows of them between messages beyond the store's open attempts (who has
// reported, what preemption, a search or Slurm asked). The Server opens them; End is the
// one way out, on every path (success, failure, interruption, a cancel, a search's stop).
// The book answers which attempt a slot belongs to, for the scheduler and for every
// message a rank sends.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "coordinator/running_attempt.h"
#include "coordinator/state_store.h"

namespace trainyard {

// What ending an attempt leaves behind: its outcome and reason in the store, the job
// ended in `job_state` (or, for kQueued, queued again from `requeue_at`) with
// `job_reason`, an event, and the message its gang's ranks are freed with.
struct AttemptEnding {
  wire::Outcome outcome = wire::OUTCOME_UNSPECIFIED;
  std::string reason;
  JobState job_state = JobState::kQueued;
  std::string job_reason;
  double requeue_at = 0;
  std::string event;
  std::string stop_message;
};

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
  // Ends `job`'s running attempt as `ending` says: the attempt's outcome, the job's state
  // and its event in one transaction of `store`, and only once it has committed, the
  // attempt leaves the book, which returns it (its ranks are then to be told). A job with
  // no running attempt changes state the same way, and nullopt is returned. If the
  // transaction fails (it throws), the attempt stays.
  std::optional<RunningAttempt> End(StateStore& store, int64_t job, const AttemptEnding& ending, double now);
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
