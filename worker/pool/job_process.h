// One job attempt as its own MPI world: the `mpirun` a pool agent starts for the job's
// ranks, and what the agent learns from it. Torch-free, and free of the wire.
//
// Note [Job isolation]
// A pool's ranks are long-lived agents (`mpirun -n N worker --coordinator ...`). They
// never run a job inside their own MPI world: MPI without the ULFM extension cannot
// revoke a communicator, so a job that failed mid-collective could only be ended by
// aborting the whole world, every other job on the pool with it. Instead the agent
// of a job's rank 0 (its lead) starts the attempt as a separate `mpirun` of the same
// worker binary, one process per job rank, placed on the hosts of the ranks the
// coordinator gave the job. The other agents of the gang hold their slots (and
// heartbeat the job) until the coordinator releases them. Whatever happens to the job
// (an exception, MPI_Abort, a signal, an MPI error) ends that mpirun only: the lead
// reports how it ended and takes new work; the pool and its other jobs go on.
//
// The job's processes talk to their lead only through a private local socket (see
// job_relay.h), and die with it: mpirun is killed if its agent dies (PR_SET_PDEATHSIG),
// and each job process if its mpirun dies. The agent's own Open MPI and PMIx
// environment is scrubbed first, or the inner mpirun would take itself for a process
// of the pool's world; the user's OMPI_MCA_* settings and the run-as-root consent are
// kept.
//
// mpirun starts with SIGPIPE ignored. Open MPI 4.1's mpirun handles SIGPIPE itself only
// while it runs: at shutdown it puts back the disposition it inherited, and a late write
// to a rank that has just exited (its PMIx or I/O channel) then kills it with SIGPIPE
// after the job has finished, which would read as a failed attempt. Ignored, that write
// fails with EPIPE and mpirun exits with the job's status. mpirun's daemons give the job
// processes the default disposition back before exec.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "worker/pool/output_lines.h"

namespace trainyard {

// Where and how to start one attempt.
struct JobLaunch {
  std::string mpirun = "mpirun";
  std::string worker;                   // the worker binary (the agent's own)
  std::vector<std::string> hosts;       // per job rank, in job rank order
  std::vector<int> slots;               // per job rank: its pool rank's index on its host (picks a GPU)
  std::string relay;                    // the lead's relay endpoint (job_relay.h)
  int64_t job_id = 0;                   // shown on the command line, for `ps`
  std::vector<std::string> extra_args;  // passed on to the job's workers (e.g. --log-level)
  bool allow_run_as_root = false;       // mpirun's --allow-run-as-root
};

// The mpirun command line for `launch`. Ranks are placed by slot in job rank order,
// so each host must appear in one run: job rank 0 runs on the first host.
std::vector<std::string> MpirunCommand(const JobLaunch& launch);

// `environment` ("NAME=value" entries) without what an enclosing mpirun set for its
// own processes (Note [Job isolation]).
std::vector<std::string> ScrubbedEnvironment(const std::vector<std::string>& environment);

// How one job rank ended, parsed from mpirun's own report; rank < 0 when it said
// nothing we know.
struct RankEnd {
  int rank = -1, signal = 0, exit_code = 0;
  std::string node;
  std::string lost_host;  // the host whose Open MPI daemon stopped answering, if mpirun said so
};
RankEnd ParseMpirunReport(const std::vector<std::string>& lines);

class JobProcess {
 public:
  // Called with each line of the job's output as it comes (output_lines.h: plain text,
  // "[rank R] " first when the job has more ranks), on the reader thread.
  using LineSink = std::function<void(const std::string& line)>;
  // Starts mpirun; each line of its output (the job's log) goes to `on_line`, is echoed to
  // this process's stderr, and becomes LastLogLine(). Throws std::runtime_error if it
  // cannot start. REQUIRES: the calling thread outlives the job (PR_SET_PDEATHSIG follows it).
  explicit JobProcess(const JobLaunch& launch, LineSink on_line = {});
  // Kills a job still running, and waits for it.
  ~JobProcess();
  JobProcess(const JobProcess&) = delete;
  JobProcess& operator=(const JobProcess&) = delete;

  // True once mpirun has exited and its output was read to the end, or for a few
  // seconds more was not: an ssh child of mpirun to a host that went away can hold the
  // output open long after mpirun is gone.
  bool Exited();
  // Asks mpirun to end the job (SIGTERM: it stops its processes and exits). Remembers
  // its children first, so that Kill() reaches them once they are orphans.
  void Terminate();
  // SIGKILL to mpirun, its process group and the children Terminate() saw.
  void Kill();
  pid_t pid() const { return pid_; }
  // REQUIRES: Exited().
  bool Succeeded() const;
  // One line on how mpirun ended, e.g. "exited with code 1" or "was killed by signal 9 (SIGKILL)".
  std::string ExitText() const;
  // The most telling lines of its output, oldest first.
  std::vector<std::string> OutputTail() const;
  // The first line of mpirun's own first message (Open MPI frames its messages between
  // lines of dashes), e.g. "mpirun has detected an attempt to run as root."; "" if none.
  std::string MpirunMessage() const;
  // When mpirun first said it is bringing the job down after a rank failed (an abort,
  // a non-zero exit, a signal, a lost daemon); nullopt while it has not.
  std::optional<Clock::time_point> EndingSince() const;

 private:
  void ReadOutput(int fd, bool tagged);
  void TakeOutputLine(OutputLine line);
  void TakeLine(std::string line);

  LineSink on_line_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::deque<std::string> tail_;
  std::string mpirun_message_;
  std::optional<Clock::time_point> ending_since_;
  bool after_rule_ = false;  // the last line that was not blank was a line of dashes
  bool output_done_ = false;
  std::atomic<bool> stop_reading_{false};
  std::optional<Clock::time_point> reaped_at_;
  std::vector<pid_t> children_;  // mpirun's, as Terminate() saw them
};

// "SIGKILL" for 9; "signal N" when unknown.
std::string SignalName(int signal);

}  // namespace trainyard
