// Standalone mode: `mpirun -n N worker JOB.yaml` runs one job over MPI_COMM_WORLD and
// writes its outputs locally; no coordinator is involved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard {

// Command-line overrides of the job file (empty / negative: keep the file's value).
struct StandaloneOptions {
  std::string job_file, runs_dir, resume;
  std::vector<std::string> set;  // --set KEY.PATH=VALUE, in order
  int threads = -1;
  int64_t max_steps = -1;
  bool no_progress = false;
  int http_port = -1, grpc_port = -1, metrics_port = -1;  // kind: serve; -1 keeps the job file's
};

// Collective over MPI_COMM_WORLD. Returns the process exit code: 0 success, 1 failure
// while running, 2 bad input. A failure mid-run aborts the world (other ranks may be
// inside a collective).
int RunStandalone(const StandaloneOptions& options);

}  // namespace trainyard
