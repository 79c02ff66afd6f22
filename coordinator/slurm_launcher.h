// The launcher of a coordinator run with --slurm (Note [Launchers] in launcher.h): each
// due job becomes one Slurm batch job, whose rank 0 registers as the world
// "slurm-<id>" and leads its ranks as a pool lead does; an elastic job, one Slurm job per
// replica. The protocol is Note [Attempts as Slurm jobs] in coordinator/slurm.h.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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
  // where each runs (priority and backfill included). Elastic attempts short of replicas
  // get another Slurm job.
  void Schedule(double now) override;
  // sbatch's answers, then squeue's view of the running attempts.
  void Follow(double now) override;
  // Under --slurm a "slurm-<id>" world is the coordinator's own: only a registration with
  // the world token of one of its submissions may take it.
  std::string RegistrationRefusal(const RankKey& key, const std::string& world_token) const override;
  // A Slurm job's rank 0, registered and idle, gets its attempt's (or its replica's) Assign.
  void RankIdle(const RankKey& key) override;
  // The start grace counts from when Slurm started the job, not from the sbatch.
  bool Started(const RunningAttempt& attempt) const override;
  // A Slurm job's end decides (Follow): the report is kept until squeue names it.
  bool DefersEnd(RunningAttempt* attempt, const RankKey& from, wire::Outcome end, const std::string& reason) override;
  // A replica that ended without success has its Slurm job cancelled.
  void ReplicaEnded(const RunningAttempt& attempt, const RankKey& slot, wire::Outcome end) override;
  // A Slurm allocation the attempt still holds is cancelled, unless it succeeded.
  void Ended(const RunningAttempt& attempt, wire::Outcome outcome) override;

 private:
  // An sbatch in flight: its job, and its replica (-1: the whole attempt).
  using SubmissionKey = std::pair<int64_t, int>;
  // An elastic job's first replicas as sbatch answers for each.
  struct FirstReplica {
    bool answered = false;
    std::string slurm_job, token, error;
  };

  // sbatch of `attempt` of `job` (an elastic job's `replica`, or -1: the whole attempt)
  // as a Slurm job of `ranks` tasks.
  void Submit(const JobRecord& job, int attempt, int replica, int ranks);
  void SubmitFirstReplicas(const JobRecord& job, int replicas, double now);
  void TakeSubmissions(double now);
  void TakeAttemptSubmission(const SlurmClient::Submitted& done, const std::string& token, double now);
  void TakeFirstReplica(const SlurmClient::Submitted& done, const std::string& token, double now);
  void OpenElasticAttempt(int64_t job_id, const std::vector<FirstReplica>& replicas, double now);
  void TakeReplacement(const SlurmClient::Submitted& done, const std::string& token, double now);
  // Note [Replacement replicas], under --slurm: one Slurm job at a time for an attempt
  // short of replicas, once the backoff of its replicas' failures has passed.
  void ReplaceLostReplicas(double now);
  // sbatch refused `job`'s submission: it fails with Slurm's words.
  void FailUnaccepted(int64_t job, const std::string& error, double now);
  void FollowJobs();
  // squeue's view of each live replica's Slurm job; those that ended go to `lost`.
  void FollowReplicas(RunningAttempt& attempt, const std::map<std::string, SlurmJobState>& states,
                      std::vector<std::tuple<int64_t, RankKey, std::string>>* lost);
  bool InFlight(int64_t job) const;
  // Whether a registration as the Slurm world `world` with `token` is one of the
  // coordinator's own attempts (Note [Worlds cannot be squatted]).
  bool ExpectedWorld(const std::string& world, const std::string& token) const;
  // A Slurm job whose world was bound to another token before it was submitted: cancelled
  // with the rest of `slurm_jobs` (an elastic job's first replicas go together), and its
  // job requeued after a backoff, with an event and a dashboard warning.
  void GiveUpSquattedJob(const JobRecord& job, const std::string& squatted, const std::vector<std::string>& slurm_jobs,
                         double now);
  void NoteStart(RunningAttempt* attempt);
  // The replica on `slot` is running in its Slurm job: its start grace counts from now.
  void NoteReplicaStart(RunningAttempt* attempt, const RankKey& slot);

  SlurmOptions options_;
  Timing timing_;
  Sources sources_;
  std::unique_ptr<SlurmClient> client_;
  std::map<SubmissionKey, std::string> tokens_;                  // sbatches in flight: their world tokens
  std::map<int64_t, std::vector<FirstReplica>> first_replicas_;  // an elastic job's, until all answered
  std::map<int64_t, double> replacement_not_before_;             // after sbatch refused a replacement
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
