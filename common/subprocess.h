// Running a command and reading what it printed, with a deadline: for the coordinator's
// calls to Slurm's client commands (sbatch, squeue, scancel, scontrol). Torch-free.
//
// The child is started with posix_spawn (safe in a threaded process), with stdin from
// /dev/null, in a process group of its own, and with only the extra environment given
// added to this process's. Its output is read as it comes, up to a cap per stream (the
// rest is drained and dropped), so a chatty or hung command can neither fill memory nor
// block the caller past `timeout_s`: then its whole group is killed (SIGKILL).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace trainyard {

struct CommandResult {
  bool started = false;    // false: it could not be started (error says why)
  bool timed_out = false;  // killed at the deadline
  int exit_code = -1;      // when it exited
  int signal = 0;          // when a signal ended it
  std::string out, err, error;

  bool ok() const { return started && !timed_out && signal == 0 && exit_code == 0; }
  // One line for a log or an error: "exit 1: <first line of stderr>", "timed out after 10 s", ...
  std::string Describe() const;
};

struct CommandOptions {
  double timeout_s = 30;
  size_t max_output_bytes = size_t(1) << 20;             // per stream
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing) this process's
};

// Runs `argv` (argv[0] looked up on PATH) and waits for it, at most `timeout_s`.
CommandResult RunCommand(const std::vector<std::string>& argv, const CommandOptions& options = {});

}  // namespace trainyard
