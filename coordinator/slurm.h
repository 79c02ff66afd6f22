// Note [Attempts as Slurm jobs]
// With --slurm the coordinator keeps its queue, attempts, restarts, epoch rows and
// results, and leaves where and when a job runs to Slurm: each attempt of a job is one
// Slurm batch job, submitted with sbatch when the attempt is due.
//
//   coordinator                         Slurm                       the allocation
//   writes <runs>/<id>/attempt-<n>/job.sbatch, sbatch --parsable -> job S (PENDING ...)
//   binds world "slurm-S" to a fresh world token (passed in sbatch's environment)
//                                       S starts (RUNNING) ->       srun worker --slurm ...
//                                                                   rank 0 registers as world
//                                                                   "slurm-S", rank 0, with that token
//   sends it the Assign; from here the attempt is a pool attempt with one slot: epoch
//   reports and one JobResult from rank 0, which leads the ranks srun started.
//
// An elastic job's attempt (Note [Elastic finetune] in worker/jobs/trainer_elastic.cc) is
// one Slurm job per replica instead, each with a world token of its own: the attempt
// opens once sbatch has answered for all of max_replicas, with one slot per Slurm job's
// world, and each replica's rank 0 gets its Assign when it registers. A replica whose
// Slurm job ends before it reported (cancelled, NODE_FAIL, killed) ends alone, and one
// that ended without success has its Slurm job cancelled; while the attempt takes
// replacements (Note [Replacement replicas] in pool_launcher.h) one more Slurm job is
// submitted at a time, after the attempt's replicas' failures' backoff, and joins as
// the next replica once sbatch answers. A replica's start grace counts from when Slurm
// starts its job.
//
// Why one Slurm job per attempt, and not pools grown and shrunk as allocations: Slurm
// then holds nothing while the queue is empty (no idle allocation to time out), each
// attempt gets Slurm's placement, limits and accounting of its own, and a failed
// attempt's nodes go back to Slurm before the retry asks again. The jobs are submitted
// with --no-requeue: the coordinator is the one queue of record and decides retries
// (resources.max_restarts), so Slurm never reruns an attempt behind its back.
//
// The world token is the attempt's secret: only a process of the Slurm job (which gets
// sbatch's environment) can register as its rank 0. Slurm keeps a job's environment
// readable by its owner and Slurm's administrators only; the generated script holds no
// secret and is kept, readable, in the attempt's folder.
//
// The coordinator follows its Slurm jobs with squeue every few seconds, on a thread of
// its own (SlurmClient): Slurm's commands can block for seconds when slurmctld is busy,
// and the loop must not. A job's state and reason (PENDING (Resources), RUNNING,
// TIMEOUT, NODE_FAIL, ...) are shown by jobctl, the dashboard and /metrics, and an
// attempt whose Slurm job ended before rank 0 reported a result fails with Slurm's state
// and reason.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace trainyard {

struct SlurmOptions {
  bool enabled = false;
  std::string partition, account;  // empty: Slurm's default
  int time_limit_minutes = 0;      // 0: the partition's default
  int signal_lead_s = 60;          // SIGUSR1 to the ranks this long before the time limit; 0: none
  std::string worker;              // the worker binary on the nodes
  std::string endpoint;            // where the ranks reach the coordinator
  std::string keys_dir;            // worker.key and coordinator.pub, on the nodes
  bool insecure = false;
  double poll_s = 2;  // between squeue calls
};

// What one attempt's Slurm job is asked for.
struct SlurmSubmission {
  int64_t job = 0;
  int attempt = 0;
  std::string name;    // the job's name
  int ranks = 1;       // Slurm tasks, one per rank
  bool gpus = false;   // one GPU per task (the job asked for cuda)
  std::string folder;  // the attempt's folder: the script and Slurm's output go there
  int replica = -1;    // an elastic job's replica, a Slurm job of its own; -1: the whole attempt
};

// The batch script for `s` (Note [Attempts as Slurm jobs]): #SBATCH lines for the
// options, then srun of the worker. Only what is safe to show: no token, no key.
std::string SbatchScript(const SlurmOptions& options, const SlurmSubmission& s);
// "slurm-<id>": the world the Slurm job's rank 0 registers as.
std::string SlurmWorld(const std::string& slurm_job);
// The Slurm job id in such a world name, or "".
std::string SlurmJobOfWorld(const std::string& world);

// A Slurm job as squeue shows it.
struct SlurmJobState {
  std::string state;   // PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, ...;
                       // empty: squeue no longer lists it (older than Slurm's MinJobAge)
  std::string reason;  // squeue's %r: Resources, Priority, None, ...
  bool ended() const;  // a terminal state, or no longer listed
  bool started() const { return state != "PENDING" && state != "CONFIGURING" && !state.empty(); }
  std::string Describe() const;  // "PENDING (Resources)", "RUNNING"
};

// squeue -h -o '%i|%T|%r' output, by job id; lines that do not parse are skipped.
std::map<std::string, SlurmJobState> ParseSqueue(const std::string& text);

// '' when slurmctld answers `scontrol ping`, else one line saying why not.
std::string SlurmUnreachable();

// Slurm's client commands on a thread of their own. The loop hands it submissions and
// cancellations and takes back what came of them; squeue is asked about every watched
// job each poll_s. Thread-safe.
class SlurmClient {
 public:
  struct Submitted {
    int64_t job = 0;
    int attempt = 0;
    std::string slurm_job;  // empty when sbatch failed
    std::string error;      // why it failed
    int replica = -1;       // SlurmSubmission::replica
  };

  explicit SlurmClient(SlurmOptions options);
  ~SlurmClient();
  SlurmClient(const SlurmClient&) = delete;
  SlurmClient& operator=(const SlurmClient&) = delete;

  // sbatch of `script_path` with `token` in the job's environment (TRAINYARD_WORLD_TOKEN).
  void Submit(const SlurmSubmission& s, const std::string& script_path, const std::string& token);
  void Cancel(const std::string& slurm_job);
  // The Slurm jobs to follow: squeue is asked about exactly these.
  void Watch(const std::set<std::string>& slurm_jobs);
  std::vector<Submitted> TakeSubmitted();
  // The latest squeue answer for the watched jobs: every job watched at that call, with
  // an empty state where squeue no longer lists it; jobs not yet asked about are absent.
  std::map<std::string, SlurmJobState> States() const;

 private:
  struct Request {
    SlurmSubmission submission;
    std::string script, token, cancel;
  };
  void Loop();
  void Poll();

  SlurmOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Request> requests_;
  std::vector<Submitted> submitted_;
  std::set<std::string> watched_;
  std::map<std::string, SlurmJobState> states_;
  bool quitting_ = false;
  std::thread thread_;
};

}  // namespace trainyard
