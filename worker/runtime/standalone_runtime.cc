#include "worker/runtime/standalone_runtime.h"

#include <mpi.h>

#include <cstdio>
#include <filesystem>

#include "worker/runtime/job_runner.h"

namespace trainyard {
namespace {

void ApplyOverrides(const StandaloneOptions& o, JobSpec* spec) {
  if (!o.runs_dir.empty()) spec->log.runs_dir = std::filesystem::absolute(o.runs_dir).string();
  if (!o.resume.empty()) spec->checkpoint.resume = o.resume;
  if (o.threads >= 0) spec->runtime.threads = o.threads;
  if (o.max_steps >= 0) spec->train.max_steps = o.max_steps;
  if (o.no_progress) spec->log.progress = false;
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
    spec = LoadJobSpec(options.job_file);
    ApplyOverrides(options, &spec);
  } catch (const SpecError& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());  // every rank read the same file
    return 2;
  }
  RankResult result = RunJobOn(std::move(spec), MPI_COMM_WORLD, LocalRank(), nullptr);
  if (result.abort_world && world > 1) MPI_Abort(MPI_COMM_WORLD, 1);  // the others may be inside a collective
  return result.exit_code;
}

}  // namespace trainyard
