#include "worker/runtime/pool_runtime.h"

#include <mpi.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <random>

#include "common/log.h"
#include "worker/pool/rank_supervisor.h"
#include "worker/runtime/job_runner.h"

// Note [World abort]
// Every rank of a pool belongs to one MPI_COMM_WORLD, made by one mpirun, and each
// job runs on a communicator of its own ranks (CreateJobComm). When a job fails in
// the middle of a run on one rank, its other ranks may already wait inside a
// collective that can never complete, and MPI (without the ULFM extension) can
// neither cancel that collective nor revoke the communicator. So the failing rank
// first reports its result (PoolAgent::Finish, then Drain for up to 5 s, so the
// coordinator learns the real reason) and then calls MPI_Abort on the world. That
// ends every rank of the pool, including ranks running other jobs: each rank's
// supervisor reports how its rank ended (RankExit), the coordinator requeues the jobs
// that were interrupted, and the pool has to be started again. A job that fails
// before any collective (bad input: every rank agrees on it in RunJobOn) or is
// stopped on request (Note [Stop agreement] in job_setup.h) ends on all its ranks at
// the same point, and the pool goes on.

namespace trainyard {
namespace {

std::atomic<bool> g_pool_stop{false};
std::atomic<bool> g_pool_busy{false};

// Idle ranks leave the pool cleanly; a rank running a job dies of the signal, as it
// would without the handler (mpirun's way to tear a world down).
void OnPoolSignal(int signal) {
  if (g_pool_busy) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
  g_pool_stop = true;
}

std::string Hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// One id and one world token for the whole mpirun, chosen by world rank 0.
void ChooseWorld(int rank, RankIdentity* self) {
  char id[64] = {}, token[64] = {};
  if (rank == 0) {
    std::random_device random;
    std::snprintf(id, sizeof id, "%s-%d-%04x", Hostname().c_str(), int(::getpid()), random() & 0xffff);
    std::snprintf(token, sizeof token, "%s", NewSecretToken().c_str());
  }
  MPI_Bcast(id, sizeof id, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Bcast(token, sizeof token, MPI_CHAR, 0, MPI_COMM_WORLD);
  self->world = id, self->world_token = token;
}

// The job's ranks only: MPI_Comm_create_group is collective over the group, so the
// rest of the world (running other jobs, or idle) is not involved.
MPI_Comm CreateJobComm(const std::vector<int>& world_ranks, int64_t job_id) {
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, static_cast<int>(world_ranks.size()), world_ranks.data(), &group);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_create_group(MPI_COMM_WORLD, group, static_cast<int>(job_id % 30000), &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return comm;
}

RankResult RunAssignment(const Assignment& a, int local_rank, PoolAgent* agent) {
  LogInfo(StrFormat("job %ld attempt %d: starting on %zu rank(s)%s", long(a.job_id), a.attempt, a.ranks.size(),
                    a.resume ? ", resuming from its latest checkpoint" : ""));
  MPI_Comm comm = CreateJobComm(a.ranks, a.job_id);
  RankResult result;
  try {
    JobSpec spec = ParseJobSpec(a.yaml, a.source, a.base_dir);
    spec.log.runs_dir = a.runs_dir;
    spec.log.progress = false;
    if (a.resume) spec.checkpoint.resume = "auto";
    result = RunJobOn(std::move(spec), comm, local_rank, agent);
  } catch (const SpecError& e) {  // the coordinator checked it; its files may have changed since
    result.exit_code = 2, result.outcome.outcome = "bad_input", result.outcome.message = e.what();
  }
  if (!result.abort_world) MPI_Comm_free(&comm);
  LogInfo(StrFormat("job %ld attempt %d: %s%s%s", long(a.job_id), a.attempt, result.outcome.outcome.c_str(),
                    result.outcome.message.empty() ? "" : ": ", result.outcome.message.c_str()));
  return result;
}

}  // namespace

int RunPool(const PoolOptions& options, int supervisor_fd) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  RankIdentity self;
  ChooseWorld(rank, &self);
  self.rank_token = NewSecretToken();
  self.rank = rank, self.world_size = world, self.host = Hostname(), self.pid = ::getpid();
  self.device = torch::cuda::is_available() ? "cuda" : "cpu";
  const int local_rank = LocalRank();
  TellSupervisor(supervisor_fd, self);
  std::signal(SIGTERM, OnPoolSignal);
  std::signal(SIGINT, OnPoolSignal);
  PoolAgent agent(options, self);
  if (rank == 0)
    LogInfo(
        StrFormat("world %s: %d rank(s) joined the pool at %s", self.world.c_str(), world, options.endpoint.c_str()));
  while (auto assignment = agent.WaitForAssignment(g_pool_stop)) {
    g_pool_busy = true;
    agent.Begin(*assignment);
    RankResult result = RunAssignment(*assignment, local_rank, &agent);
    agent.Finish(result.outcome);
    g_pool_busy = false;
    if (result.abort_world) {  // Note [World abort]: report first
      agent.Drain(5);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  agent.Drain(5);
  return 0;
}

}  // namespace trainyard
