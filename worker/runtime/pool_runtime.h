// Pool mode: `mpirun -n N worker --coordinator ENDPOINT` makes every rank a member of
// the coordinator's worker pool; each rank waits for assignments and runs each job on
// a communicator of that job's ranks only.
#pragma once

#include "worker/pool/pool_agent.h"

namespace trainyard {

// Runs until SIGTERM/SIGINT while idle (returns 0). `supervisor_fd` is the pipe to
// this rank's supervisor (see rank_supervisor.h). Collective over MPI_COMM_WORLD at
// start (the world id); afterwards only over each job's ranks.
int RunPool(const PoolOptions& options, int supervisor_fd);

}  // namespace trainyard
