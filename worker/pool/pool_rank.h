// What a pool agent does with its assignments (Note [Job isolation] in job_process.h):
// the agent of a job's rank 0 leads it, as its own mpirun over the hosts and slots the
// assignment names, and reports how it ended; the others hold their slots until the
// coordinator releases them. Torch-free.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "worker/pool/pool_agent.h"

namespace trainyard {

struct JobLaunch;  // worker/pool/job_process.h

struct JobLaunchOptions {
  std::string mpirun = "mpirun";
  std::string worker;                 // this binary
  std::vector<std::string> job_args;  // passed on to every job's workers
  double stop_grace_s = 30;           // after a relayed stop, before mpirun is told to end the job
  double abort_grace_s = 5;           // after a rank failed (mpirun or rank 0 says so), before mpirun is told
                                      // to end the job
  double kill_grace_s = 10;           // after mpirun was told, before its process group is killed
  bool allow_run_as_root = false;     // pass --allow-run-as-root to each job's mpirun
};

class PoolRank {
 public:
  // `agent` must outlive this object.
  PoolRank(PoolAgent& agent, JobLaunchOptions options);

  // Serves assignments until `stop` becomes true while idle.
  // REQUIRES: called from the thread that started the agent's process's work (the
  // job's mpirun is tied to this thread's life: PR_SET_PDEATHSIG).
  void Serve(const std::atomic<bool>& stop, std::atomic<bool>& busy);

 private:
  JobOutcome Lead(const Assignment& assignment);
  JobLaunch LaunchOf(const Assignment& assignment, const std::string& relay_endpoint) const;
  JobOutcome HoldSlot(const Assignment& assignment);

  PoolAgent& agent_;
  JobLaunchOptions options_;
};

}  // namespace trainyard
