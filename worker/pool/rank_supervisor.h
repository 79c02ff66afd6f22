// Every pool agent process is the child of a small supervisor, so the coordinator
// learns how an agent ended even when it cannot say so itself (kill -9, a crash, the
// OOM killer): the supervisor waits for it and sends a RankExit naming the exit code or
// signal. Torch-free.
//
// Whatever starts the agent (a shell, a service manager, mpirun) starts the supervisor;
// signals it receives are forwarded to the agent, and the agent is killed if the
// supervisor dies. The agent tells the supervisor who it is (world id, rank and rank
// token) through a pipe once it has chosen its identity. Under mpirun the supervisor
// exits 0 whatever the agent's end, so that mpirun never stops the other agents.
#pragma once

#include <string>

#include "worker/pool/pool_agent.h"

namespace trainyard {

// Forks. In the child (the rank) returns the pipe's write end, for TellSupervisor. In
// the parent supervises the child, then exits with the child's status
// (128 + signal when a signal ended it; 0 under mpirun): it never returns.
// REQUIRES: called before any thread is started.
// The supervisor reports to `options.endpoint`, with its keys.
int ForkRankSupervisor(const PoolOptions& options);

// Called by the rank once it knows its identity; closes `fd`.
void TellSupervisor(int fd, const RankIdentity& self);

}  // namespace trainyard
