// What a pool rank does with its assignments (Note [Job isolation] in job_process.h):
// the agent of a job's rank 0 leads it, as its own mpirun, and reports how it ended;
// the others hold their slots until the coordinator releases them. Torch-free.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "worker/pool/pool_agent.h"

namespace trainyard {

// Where every rank of the pool's world runs, by world rank (gathered at start-up).
struct PoolLayout {
  std::vector<std::string> hosts;
  std::vector<int> slots;  // the rank's index among the world's ranks on its host
};

struct JobLaunchOptions {
  std::string mpirun = "mpirun";
  std::string worker;                 // this binary
  std::vector<std::string> job_args;  // passed on to every job's workers
  double stop_grace_s = 30;           // after a relayed stop, before mpirun is told to end the job
};

class PoolRank {
 public:
  // `agent` must outlive this object.
  PoolRank(PoolAgent& agent, PoolLayout layout, JobLaunchOptions options);

  // Serves assignments until `stop` becomes true while idle.
  // REQUIRES: called from the thread that started the agent's process's work (the
  // job's mpirun is tied to this thread's life: PR_SET_PDEATHSIG).
  void Serve(const std::atomic<bool>& stop, std::atomic<bool>& busy);

 private:
  JobOutcome Lead(const Assignment& assignment);
  JobOutcome HoldSlot(const Assignment& assignment);

  PoolAgent& agent_;
  PoolLayout layout_;
  JobLaunchOptions options_;
};

}  // namespace trainyard
