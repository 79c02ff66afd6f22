// In pool mode every rank process is the child of a small supervisor, so the
// coordinator learns how a rank ended even when it cannot say so itself (kill -9, a
// crash, the OOM killer): the supervisor waits for it and sends a RankExit naming the
// exit code or signal. Torch-free.
//
// mpirun starts the supervisor; signals it receives are forwarded to the rank, and
// the rank is killed if the supervisor dies. The rank tells the supervisor who it is
// (world id, rank and rank token) through a pipe once MPI is up.
#pragma once

#include <string>

#include "worker/pool/pool_agent.h"

namespace trainyard {

// Forks. In the child (the rank) returns the pipe's write end, for TellSupervisor. In
// the parent supervises the child, then exits with the child's status
// (128 + signal when a signal ended it): it never returns.
// REQUIRES: called before MPI_Init and before any thread is started.
// The supervisor reports to `options.endpoint`, with its keys.
int ForkRankSupervisor(const PoolOptions& options);

// Called by the rank once it knows its identity; closes `fd`.
void TellSupervisor(int fd, const RankIdentity& self);

}  // namespace trainyard
