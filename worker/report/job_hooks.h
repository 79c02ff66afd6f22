// How a job running in a worker pool talks to the pool, without knowing about it:
// epoch rows go out as they are final, and a stop request (cancel) comes in. Torch-free.
// Standalone runs have no hooks.
#pragma once

#include <stdexcept>
#include <string>

#include "worker/report/run_log.h"

namespace trainyard {

class JobHooks {
 public:
  virtual ~JobHooks() = default;
  // On the job's rank 0, once the epoch's checkpoint is on disk (so a later attempt
  // resumes after it and never reports it twice). Also called, at the start of a
  // resumed attempt, for the epochs done before it.
  virtual void EpochDone(const EpochRow& row, const std::string& csv_header, const std::string& csv_line) = 0;
  // True once this rank was told to stop the job. Runners agree on it across ranks
  // before acting, so every rank stops at the same step.
  virtual bool StopRequested() const = 0;
  // True when the stop requested is a preemption: a fine-tune job then checkpoints where
  // its ranks stopped and ends as preempted (requeued without counting a restart).
  virtual bool PreemptRequested() const { return false; }
  // On the job's rank 0, from its communicator's thread, just before that rank aborts
  // the job's MPI world (a collective timed out, or a device failed): `error` names the
  // ranks that never reached the collective. Tells whoever leads the job that it failed
  // and why, so the job is ended on the rank's own words, not only on what mpirun
  // prints (which can fail to arrive while a host is unreachable). Must not block.
  virtual void Aborting(const std::string& error) { (void)error; }
};

// Thrown by a runner that stopped because its ranks agreed on a stop request.
class JobStopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown instead by a fine-tune job stopped by a scheduler's signal (SIGTERM: preemption;
// SIGUSR1: a time limit ahead, Slurm's --signal) or by a coordinator's preemption
// (JobHooks::PreemptRequested), once it has written the checkpoint a rerun resumes from.
class JobPreempted : public JobStopped {
 public:
  using JobStopped::JobStopped;
};

}  // namespace trainyard
