#include "worker/runtime/standalone_runtime.h"

#include <mpi.h>

#include <cstdio>
#include <filesystem>

#include "worker/runtime/job_runner.h"

namespace trainyard {
namespace {

// The command line's changes to the job file, in order, each named by its flag in
// messages: the job that runs is its file after them (runs/<name>/job.yaml). Paths on
// the command line are taken from the working directory.
SpecOverrides OverridesOf(const StandaloneOptions& o) {
  namespace fs = std::filesystem;
  SpecOverrides overrides;
  overrides.expand_environment = true;
  for (const std::string& assignment : o.set) overrides.AddAssignment(assignment);
  if (!o.runs_dir.empty())
    overrides.Add("log.runs_dir", fs::absolute(o.runs_dir).string(), "--runs-dir " + o.runs_dir, /*literal=*/true);
  if (!o.resume.empty())
    overrides.Add("checkpoint.resume",
                  o.resume == "none" || o.resume == "auto" ? o.resume : fs::absolute(o.resume).string(),
                  "--resume " + o.resume, /*literal=*/true);
  if (o.threads >= 0)
    overrides.Add("runtime.threads", std::to_string(o.threads), "--threads " + std::to_string(o.threads));
  if (o.max_steps >= 0)
    overrides.Add("train.max_steps", std::to_string(o.max_steps), "--max-steps " + std::to_string(o.max_steps));
  if (o.no_progress) overrides.Add("log.progress", "false", "--no-progress");
  return overrides;
}

// kind: serve's ports, which other kinds ignore.
void ApplyServePorts(const StandaloneOptions& o, JobSpec* spec) {
  if (o.http_port >= 0) spec->serve.http_port = o.http_port;
  if (o.grpc_port >= 0) spec->serve.grpc_port = o.grpc_port;
  if (o.metrics_port >= 0) spec->serve.metrics_port = o.metrics_port;
}

}  // namespace

int RunStandalone(const StandaloneOptions& options) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  JobSpec spec;
  try {
    spec = LoadJobSpec(options.job_file, OverridesOf(options));
    ApplyServePorts(options, &spec);
  } catch (const SpecError& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());  // every rank read the same file
    return 2;
  }
  RankResult result = RunJobOn(std::move(spec), MPI_COMM_WORLD, LocalRank(), nullptr);
  if (result.abort_world && world > 1) MPI_Abort(MPI_COMM_WORLD, 1);  // the others may be inside a collective
  return result.exit_code;
}

}  // namespace trainyard
