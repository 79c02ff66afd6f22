// The worker: `worker JOB.yaml` runs one job standalone over MPI_COMM_WORLD.
// Exit codes: 0 success, 1 failure while running, 2 bad input (job file, datasets,
// checkpoints) reported as one line naming the file, line and key.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "proto/job_spec.h"
#include "worker/log.h"
#include "worker/trainer.h"

namespace {

struct Options {
  std::string job_file, runs_dir, resume, log_level = "info";
  int threads = -1;
  int64_t max_steps = -1;
  bool no_progress = false;
};

void ApplyOverrides(const Options& o, trainyard::JobSpec* spec) {
  if (!o.runs_dir.empty()) spec->log.runs_dir = std::filesystem::absolute(o.runs_dir).string();
  if (!o.resume.empty()) spec->checkpoint.resume = o.resume;
  if (o.threads >= 0) spec->runtime.threads = o.threads;
  if (o.max_steps >= 0) spec->train.max_steps = o.max_steps;
  if (o.no_progress) spec->log.progress = false;
}

int RunJob(const Options& options, int world_rank, int world_size) {
  try {
    trainyard::JobSpec spec = trainyard::LoadJobSpec(options.job_file);
    ApplyOverrides(options, &spec);
    if (world_size > 1)
      throw trainyard::InputError(options.job_file + ": launched on " + std::to_string(world_size) +
                                  " MPI ranks, but this build trains on one rank only");
    trainyard::Trainer trainer(std::move(spec));
    nlohmann::json summary = trainer.Run();
    trainyard::LogInfo("done: " + trainer.run_dir() + " (model in " + summary["model_dir"].get<std::string>() + ")");
    return 0;
  } catch (const trainyard::SpecError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const trainyard::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    trainyard::LogError("rank " + std::to_string(world_rank) + ": job failed: " + e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trainyard worker: runs a fine-tuning job described by a YAML file.\n"
               "Standalone: worker JOB.yaml, or mpirun -n 1 worker JOB.yaml.\n"
               "Writes runs/<job name>/{epochs.csv,steps.jsonl,summary.json,checkpoints/,model/}."};
  Options o;
  app.add_option("job", o.job_file, "job YAML file (see configs/jobs/langid_tiny.yaml)")->required();
  app.add_option("--runs-dir", o.runs_dir, "folder for runs/<job>/ (default: log.runs_dir, else ./runs)");
  app.add_option("--resume", o.resume, "none, auto (latest valid checkpoint) or a checkpoint file");
  app.add_option("--threads", o.threads, "intra-op threads per rank (0: libtorch default)");
  app.add_option("--max-steps", o.max_steps, "stop after this many steps (0: no limit)");
  app.add_flag("--no-progress", o.no_progress, "no progress line while an epoch runs");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  trainyard::LogSetup(o.log_level);

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int code = RunJob(o, rank, size);
  MPI_Finalize();
  return code;
}
