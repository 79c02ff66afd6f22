// The launcher of a coordinator run with --slurm (Note [Launchers] in launcher.h): each
// due job becomes one Slurm batch job, whose rank 0 registers as the world
// "slurm-<id>" and leads its ranks as a pool lead does. The protocol is Note [Attempts as
// Slurm jobs] in coordinator/slurm.h.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "coordinator/attempt_book.h"
#include "coordinator/launcher.h"
#include "coordinator/listening_clock.h"
#include "coordinator/rank_registry.h"
#include "coordinator/slurm.h"
#include "coordinator/state_store.h"

namespace trainyard {

class SlurmLauncher : public Launcher {
 public:
  // What it reads and changes of the loop's state, all owned by the loop and outliving it.
  struct Sources {
    StateStore& store;
    RankRegistry& ranks;
    AttemptBook& running;
    const ListeningClock& listening;
    LaunchLoop& loop;
  };
  struct Timing {
    double grace_s = 30;           // for a started Slurm job's rank 0 to start, and for a reported one to end
    double restart_backoff_s = 2;  // at least 10 s before a squatted job is submitted again
  };
  // Starts the client that runs sbatch, scancel and squeue off the loop thread.
  SlurmLauncher(const SlurmOptions& options, Timing timing, Sources sources);
  ~SlurmLauncher() override;

  // Every due job goes to Slurm at once: Slurm, not the coordinator, decides when and
  // where each runs (priority and backfill included).
  void Schedule(double now) override;
  // sbatch's answers, then squeue's view of the running attempts.
  void Follow(double now) override;
  // Under --slurm a "slurm-<id>" world is the coordinator's own: only a registration with
  // the world token of one of its submissions may take it.
  std::string RegistrationRefusal(const RankKey& key, const std::string& world_token) const override;
  // A Slurm job's rank 0, registered and idle, gets its attempt's Assign.
  void RankIdle(const RankKey& key) override;
  // The start grace counts from when Slurm started the job, not from the sbatch.
  bool Started(const RunningAttempt& attempt) const override;
  // A Slurm job's end decides (Follow): the report is kept until squeue names it.
  bool DefersEnd(RunningAttempt* attempt, const RankKey& from, wire::Outcome end, const std::string& reason) override;
  // A Slurm allocation the attempt still holds is cancelled, unless it succeeded.
  void Ended(const RunningAttempt& attempt, wire::Outcome outcome) override;

 private:
  void Submit(const JobRecord& job, double now);
  void TakeSubmissions(double now);
  void FollowJobs();
  // Whether a registration as the Slurm world `world` with `token` is one of the
  // coordinator's own attempts (Note [Worlds cannot be squatted]).
  bool ExpectedWorld(const std::string& world, const std::string& token) const;
  // A Slurm job whose world was bound to another token before it was submitted: cancelled,
  // and its job requeued after a backoff, with an event and a dashboard warning.
  void GiveUpSquattedJob(const JobRecord& job, const std::string& slurm_job, double now);
  void NoteStart(RunningAttempt* attempt);

  SlurmOptions options_;
  Timing timing_;
  Sources sources_;
  std::unique_ptr<SlurmClient> client_;
  std::map<int64_t, std::string> tokens_;  // jobs whose sbatch is in flight: their world token
};

// How an attempt whose Slurm job ended as `slurm` ends, given what its rank 0 reported
// before (`attempt.reported`, `reported_reason`) and whether the coordinator cancelled it
// (`attempt.cancel_sent`): the reason and how it counts against restarts.
struct SlurmAttemptEnd {
  std::string reason;
  Retry retry = Retry::kCounted;
};
SlurmAttemptEnd EndOfSlurmAttempt(const RunningAttempt& attempt, const SlurmJobState& slurm);

}  // namespace trainyard
