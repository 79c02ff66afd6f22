// Runs one job over the ranks of an MPI communicator, the same way standalone and in a
// pool: picks the communicator backend, builds the job kind's runner on every rank,
// runs it, and turns what happened into a RankResult.
#pragma once

#include <mpi.h>

#include "common/spec/job_spec.h"
#include "worker/pool/pool_agent.h"
#include "worker/report/job_hooks.h"

namespace trainyard {

struct ElasticRun;  // worker/jobs/trainer.h

// A standalone finetune job stopped by a signal after writing its checkpoint (rerun it
// with checkpoint.resume: auto to go on).
constexpr int kPreemptedExitCode = 3;

// How a job ended on this rank.
struct RankResult {
  int exit_code = 0;  // 0 ok, 1 failure, 2 bad input, 3 preempted
  JobOutcome outcome;
  // A failure mid-run, after which the job's other ranks may wait inside a collective
  // forever: the caller aborts the job's MPI world, which is the job's own (Note [Job
  // isolation] in worker/pool/job_process.h).
  bool abort_world = false;
};

// Runs `spec` over the ranks of `comm` (collective over it). Reports bad input on
// rank 0's stderr and failures in the log; never throws. `hooks` is null standalone;
// `elastic`, set for a replica of a pool's elastic attempt, trains it as one
// (Trainer::RunElastic).
RankResult RunJobOn(JobSpec spec, MPI_Comm comm, int local_rank, JobHooks* hooks, const ElasticRun* elastic = nullptr);

// This process's rank among the ranks of MPI_COMM_WORLD on its node (picks its GPU).
int LocalRank();

// From now on, for the life of the process, SIGTERM and SIGUSR1 are kept as a stop request
// for the finetune job it will run, instead of ending it: a scheduler's signal that comes
// while MPI and the model start up is not lost (a rank of an attempt run as a Slurm job).
// Other job kinds never read it: they end when the scheduler's SIGKILL follows.
void KeepSchedulerSignalsFromNow();

}  // namespace trainyard
