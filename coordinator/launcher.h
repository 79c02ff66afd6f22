// Note [Launchers]
// How a queued job's attempt comes to run. The loop (Server) owns the rank registry, the
// attempt book and the store, and is the one way an attempt ends (Server::EndJobsAttempt);
// a launcher decides when and where attempts start and follows whatever runs them
// outside the loop. There are two:
//  - PoolLauncher (coordinator/pool_launcher.h): a scheduling pass places queued jobs on
//    the slots of the registered pool agents (coordinator/scheduler.h), preempting where
//    the policy allows (Note [Preemption] in server_pool.cc);
//  - SlurmLauncher (coordinator/slurm_launcher.h, under --slurm): each due job becomes a
//    Slurm batch job, and Slurm decides when and where it runs (Note [Attempts as Slurm
//    jobs] in coordinator/slurm.h).
// The loop asks its launcher at every point where the two differ: a rank's registration,
// each turn's timers, a scheduling pass, an attempt's start grace, its lead's report of a
// failure, and its end. A launcher acts on the loop only through LaunchLoop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/rank_registry.h"
#include "coordinator/running_attempt.h"
#include "coordinator/state_store.h"
#include "trainyard.pb.h"

namespace trainyard {

// How an ended attempt counts against resources.max_restarts.
enum class Retry {
  kCounted,  // the job's own failure (or one we cannot tell apart from it): uses a restart
  kFree,     // interrupted from outside (its pool was stopped, or never came back): requeued as is
  kNever,    // its input is at fault: retrying cannot help
};

// What a launcher may ask of the loop (the Server implements it).
class LaunchLoop {
 public:
  // The loop's clock (ServerOptions::clock): what the store records.
  virtual double Now() const = 0;
  // Creates the folder of `job`'s next attempt; false (the job failed, said why) if it cannot be.
  virtual bool MakeAttemptFolder(const JobRecord& job, double now) = 0;
  // Records a new attempt of `job` on `slots` (one transaction, with an event saying
  // `how`) and keeps it running.
  virtual RunningAttempt& OpenAttempt(const JobRecord& job, const std::vector<RankKey>& slots, const std::string& how,
                                      double now) = 0;
  // Sends `job`'s Assign for `attempt` to its slot `to`.
  virtual void SendAssign(const JobRecord& job, const RunningAttempt& attempt, const RankKey& to) = 0;
  // Starts a replica of the elastic `attempt` on the free `slot`, in place of a lost one
  // (Note [Replacement replicas] in pool_launcher.h): the slot joins the attempt, and
  // gets its Assign now if its rank is registered and idle (else once it is: RankIdle).
  virtual void AddReplica(RunningAttempt& attempt, const RankKey& slot, double now) = 0;
  // The replica of the elastic `attempt` on `slot` is lost, for `reason` (its Slurm job
  // ended before it reported): it ends as failed.
  virtual void ReplicaLost(RunningAttempt& attempt, const RankKey& slot, const std::string& reason) = 0;
  // Ends `job`'s running attempt as failed or interrupted, requeueing it as `retry` and
  // its restarts allow.
  virtual void FailAttempt(int64_t job, const std::string& reason, Retry retry) = 0;
  // Asks `victim`'s attempt to stop for the job `head` (Note [Preemption]).
  virtual void Preempt(int64_t victim, const std::string& head) = 0;
  // The folder of `job`'s attempt `attempt`, below the runs folder.
  virtual std::string AttemptDir(int64_t job, int attempt) const = 0;
  // Writes `bytes` as `name` in the folder of `job`'s attempt `attempt`.
  virtual void WriteAttemptFile(int64_t job, int attempt, const std::string& name, const std::string& bytes) = 0;

 protected:
  ~LaunchLoop() = default;
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // A scheduling pass: starts what may start of the queue now.
  virtual void Schedule(double now) = 0;
  // Each turn of the loop, before a pass: what happened outside it since.
  virtual void Follow(double now) { (void)now; }
  // Why a registration of `key` with `world_token` is refused beyond the registry's own
  // rules (Note [Worlds cannot be squatted]); "" if it is not.
  virtual std::string RegistrationRefusal(const RankKey& key, const std::string& world_token) const {
    (void)key, (void)world_token;
    return "";
  }
  // `key` registered (again) and holds no job.
  virtual void RankIdle(const RankKey& key) { (void)key; }
  // Whether `attempt`'s processes have been started: its start grace counts from then.
  virtual bool Started(const RunningAttempt& attempt) const {
    (void)attempt;
    return true;
  }
  // The lead `from` of `attempt` reported `end` (not a success) for `reason`. True if the
  // launcher ends the attempt itself once it knows more (it notes the report in the
  // attempt); false: the loop ends it now.
  virtual bool DefersEnd(RunningAttempt* attempt, const RankKey& from, wire::Outcome end, const std::string& reason) {
    (void)attempt, (void)from, (void)end, (void)reason;
    return false;
  }
  // The replica of the elastic `attempt` on `slot` has ended with `end`: what it holds
  // outside the loop is given back unless it succeeded.
  virtual void ReplicaEnded(const RunningAttempt& attempt, const RankKey& slot, wire::Outcome end) {
    (void)attempt, (void)slot, (void)end;
  }
  // `attempt` has ended with `outcome`: what it holds outside the loop is given back.
  virtual void Ended(const RunningAttempt& attempt, wire::Outcome outcome) { (void)attempt, (void)outcome; }
};

}  // namespace trainyard
