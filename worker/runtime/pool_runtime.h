// Pool mode: `worker --coordinator ENDPOINT` is an agent of the coordinator's worker
// pool, one slot, with no MPI of its own; the agent of each job's rank 0 runs the job as
// its own mpirun of this binary in job mode (`--pool-job`) over the slots the
// coordinator gave it, so that a failing job ends alone (Note [Job isolation] in
// worker/pool/job_process.h).
#pragma once

#include <string>
#include <vector>

#include "worker/pool/pool_agent.h"
#include "worker/pool/pool_rank.h"

namespace trainyard {

// Runs until SIGTERM/SIGINT while idle (returns 0). `supervisor_fd` is the pipe to
// this agent's supervisor (see rank_supervisor.h). Makes no MPI call.
int RunPool(const PoolOptions& options, JobLaunchOptions launch, int supervisor_fd);

// Job mode: one attempt over MPI_COMM_WORLD (the job's own mpirun). Rank 0 fetches the
// assignment from the agent at `relay` (worker/pool/job_relay.h); job rank r uses the
// GPU of pool slot `slots[r]`. Returns the exit code; a failure mid-run aborts this
// world only.
int RunPoolJob(const std::string& relay, const std::vector<int>& slots);

// One attempt that `coordinator --slurm` submitted as a Slurm job, over MPI_COMM_WORLD (the
// ranks srun started): rank 0 registers as the Slurm job's world with the token in its
// environment, gets the assignment, and reports epochs and the result itself (Note
// [Attempts as Slurm jobs] in coordinator/slurm.h). Returns the exit code.
int RunSlurmAttempt(const PoolOptions& options);

}  // namespace trainyard
