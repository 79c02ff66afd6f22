// The worker: `worker JOB.yaml` runs one job standalone over MPI_COMM_WORLD, one rank
// per process (`mpirun -n 4 worker JOB.yaml` trains data-parallel over 4 ranks).
// Exit codes: 0 success, 1 failure while running, 2 bad input (job file, datasets,
// checkpoints) reported as one line naming the file, line and key.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "proto/job_spec.h"
#include "worker/comm/mpi_communicator.h"
#ifdef TRAINYARD_WITH_NCCL
#include "worker/comm/nccl_communicator.h"
#endif
#include "worker/benchmark.h"
#include "worker/inference.h"
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

int LocalRank() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  return local;
}

// NCCL for CUDA jobs when it was built in (or asked for), MPI otherwise. Throws
// InputError when the job asks for NCCL where it cannot run.
bool ChooseNccl(const trainyard::JobSpec& spec) {
  const bool cuda_job = spec.runtime.device != trainyard::DeviceChoice::kCpu && torch::cuda::is_available();
#ifdef TRAINYARD_WITH_NCCL
  const bool built = true;
#else
  const bool built = false;
#endif
  if (spec.distributed.backend == trainyard::CommBackend::kNccl) {
    if (!cuda_job)
      throw trainyard::InputError(spec.Where("distributed.backend") + ": nccl needs a CUDA job and a visible GPU");
    if (!built) throw trainyard::InputError(spec.Where("distributed.backend") + ": this build has no NCCL");
    return true;
  }
  return spec.distributed.backend == trainyard::CommBackend::kAuto && cuda_job && built;
}

// Builds the job's runner on every rank; if any rank rejects its input, all exit with 2.
template <typename Runner>
std::unique_ptr<Runner> MakeRunner(trainyard::JobSpec spec, const trainyard::RankContext& ranks) {
  std::unique_ptr<Runner> runner;
  bool failed = false;
  try {
    runner = std::make_unique<Runner>(std::move(spec), ranks);
  } catch (const trainyard::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    failed = true;
  }
  if (ranks.comm && ranks.comm->AnyTrue(failed, "input check")) failed = true;
  if (failed) throw trainyard::InputError("");  // already reported by the rank(s) at fault
  return runner;
}

template <typename Runner>
void RunKind(trainyard::JobSpec spec, const trainyard::RankContext& ranks) {
  auto runner = MakeRunner<Runner>(std::move(spec), ranks);
  nlohmann::json summary = runner->Run();
  if (ranks.rank == 0 && summary.contains("model_dir"))
    trainyard::LogInfo("done: " + runner->run_dir() + " (model in " + summary["model_dir"].get<std::string>() + ")");
}

int RunJob(const Options& options, int rank, int world) {
  trainyard::JobSpec spec;
  try {
    spec = trainyard::LoadJobSpec(options.job_file);
    ApplyOverrides(options, &spec);
  } catch (const trainyard::SpecError& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());  // every rank read the same file
    return 2;
  }
  const int local_rank = LocalRank();
  std::unique_ptr<trainyard::MpiCommunicator> mpi;
  std::unique_ptr<trainyard::Communicator> nccl;
  try {
    const bool use_nccl = ChooseNccl(spec);
    if (world > 1) mpi = std::make_unique<trainyard::MpiCommunicator>(MPI_COMM_WORLD, spec.distributed.timeout_s);
#ifdef TRAINYARD_WITH_NCCL
    if (world > 1 && use_nccl)
      nccl = std::make_unique<trainyard::NcclCommunicator>(
          *mpi, local_rank % static_cast<int>(torch::cuda::device_count()), spec.distributed.timeout_s);
#else
    (void)use_nccl;
#endif
  } catch (const trainyard::InputError& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  trainyard::Communicator* comm = nccl ? nccl.get() : static_cast<trainyard::Communicator*>(mpi.get());
  trainyard::RankContext ranks{rank, world, local_rank, comm};
  try {
    switch (spec.kind) {
      case trainyard::JobKind::kFinetune: RunKind<trainyard::Trainer>(std::move(spec), ranks); break;
      case trainyard::JobKind::kBenchmark: RunKind<trainyard::BenchmarkRunner>(std::move(spec), ranks); break;
      case trainyard::JobKind::kInference: RunKind<trainyard::InferenceRunner>(std::move(spec), ranks); break;
    }
    return 0;
  } catch (const trainyard::InputError&) {
    return 2;
  } catch (const std::exception& e) {
    trainyard::LogError("rank " + std::to_string(rank) + ": job failed: " + e.what());
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may be inside a collective
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trainyard worker: runs a finetune, benchmark or inference job described by a YAML file.\n"
               "Standalone: worker JOB.yaml (one rank), or mpirun -n N worker JOB.yaml\n"
               "(data-parallel over N ranks; train.batch_size is per rank).\n"
               "Rank 0 writes runs/<job name>/: finetune {epochs.csv,steps.jsonl,summary.json,checkpoints/,model/},\n"
               "benchmark {benchmark.csv,benchmark.md,*.svg,env.json}, inference {predictions.tsv,summary.json}."};
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

  // The comm thread makes every MPI call after start-up, never two threads at once.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (provided < MPI_THREAD_SERIALIZED) {
    if (rank == 0) std::fprintf(stderr, "error: this MPI library lacks MPI_THREAD_SERIALIZED support\n");
    MPI_Finalize();
    return 1;
  }
  int code = RunJob(o, rank, world);
  MPI_Finalize();
  return code;
}
