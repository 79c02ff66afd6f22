// The worker: `worker JOB.yaml` runs one job standalone over MPI_COMM_WORLD, one rank
// per process (`mpirun -n 4 worker JOB.yaml` trains data-parallel over 4 ranks).
// `mpirun -n 4 worker --coordinator ENDPOINT` makes the ranks a worker pool instead.
// Exit codes: 0 success, 1 failure while running, 2 bad input (job file, datasets,
// checkpoints) reported as one line naming the file, line and key. A pool rank exits 0
// when stopped (SIGTERM, SIGINT) while idle; the outcome of each job goes to the
// coordinator instead.
#include <mpi.h>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>

#include "proto/job_spec.h"
#include "worker/comm/mpi_communicator.h"
#ifdef TRAINYARD_WITH_NCCL
#include "worker/comm/nccl_communicator.h"
#endif
#include "worker/benchmark.h"
#include "worker/inference.h"
#include "worker/log.h"
#include "worker/pool_agent.h"
#include "worker/rank_supervisor.h"
#include "worker/trainer.h"

namespace {

struct Options {
  std::string job_file, runs_dir, resume, log_level = "info", coordinator;
  double heartbeat_s = 1.0;
  int liveness = 3;
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

// Builds the job's runner on every rank; if any rank rejects its input, all throw
// InputError (the rank at fault with its message).
template <typename Runner>
std::unique_ptr<Runner> MakeRunner(trainyard::JobSpec spec, const trainyard::RankContext& ranks) {
  std::unique_ptr<Runner> runner;
  std::string error;
  try {
    runner = std::make_unique<Runner>(std::move(spec), ranks);
  } catch (const trainyard::InputError& e) {
    error = e.what();
  }
  const bool failed = ranks.comm ? ranks.comm->AnyTrue(!error.empty(), "input check") : !error.empty();
  if (failed) throw trainyard::InputError(error.empty() ? "" : error);  // empty: another rank is at fault
  return runner;
}

template <typename Runner>
nlohmann::json RunKind(trainyard::JobSpec spec, const trainyard::RankContext& ranks) {
  auto runner = MakeRunner<Runner>(std::move(spec), ranks);
  nlohmann::json summary = runner->Run();
  if (ranks.rank == 0 && summary.contains("model_dir"))
    trainyard::LogInfo("done: " + runner->run_dir() + " (model in " + summary["model_dir"].get<std::string>() + ")");
  return summary;
}

// How a job ended on this rank. `abort_world`: a failure mid-run, after which the
// job's other ranks may wait inside a collective forever.
struct RankResult {
  int exit_code = 0;  // 0 ok, 1 failure, 2 bad input
  trainyard::JobOutcome outcome;
  bool abort_world = false;
};

RankResult Failed(int code, const std::string& outcome, const std::string& message) {
  RankResult r;
  r.exit_code = code, r.outcome.outcome = outcome, r.outcome.message = message;
  return r;
}

// Runs `spec` over the ranks of `comm` (collective over it).
RankResult RunJobOn(trainyard::JobSpec spec, MPI_Comm comm, int local_rank, trainyard::JobHooks* hooks) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  std::unique_ptr<trainyard::MpiCommunicator> mpi;
  std::unique_ptr<trainyard::Communicator> nccl;
  try {
    const bool use_nccl = ChooseNccl(spec);
    if (world > 1) mpi = std::make_unique<trainyard::MpiCommunicator>(comm, spec.distributed.timeout_s);
#ifdef TRAINYARD_WITH_NCCL
    if (world > 1 && use_nccl)
      nccl = std::make_unique<trainyard::NcclCommunicator>(
          *mpi, local_rank % static_cast<int>(torch::cuda::device_count()), spec.distributed.timeout_s);
#else
    (void)use_nccl;
#endif
  } catch (const trainyard::InputError& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return Failed(2, "bad_input", e.what());
  }
  trainyard::Communicator* communicator = nccl ? nccl.get() : static_cast<trainyard::Communicator*>(mpi.get());
  trainyard::RankContext ranks{rank, world, local_rank, communicator, hooks};
  try {
    nlohmann::json summary;
    switch (spec.kind) {
      case trainyard::JobKind::kFinetune: summary = RunKind<trainyard::Trainer>(std::move(spec), ranks); break;
      case trainyard::JobKind::kBenchmark: summary = RunKind<trainyard::BenchmarkRunner>(std::move(spec), ranks); break;
      case trainyard::JobKind::kInference: summary = RunKind<trainyard::InferenceRunner>(std::move(spec), ranks); break;
    }
    RankResult result;
    if (rank == 0) result.outcome.summary_json = summary.dump();
    return result;
  } catch (const trainyard::InputError& e) {
    if (*e.what()) std::fprintf(stderr, "error: %s\n", e.what());
    return Failed(2, "bad_input", *e.what() ? e.what() : "another rank of the job rejected its input");
  } catch (const trainyard::JobStopped& e) {
    trainyard::LogInfo(e.what());
    return Failed(1, "cancelled", e.what());
  } catch (const std::exception& e) {
    trainyard::LogError("rank " + std::to_string(rank) + ": job failed: " + e.what());
    RankResult result = Failed(1, "failed", e.what());
    result.abort_world = world > 1;
    return result;
  }
}

int RunStandalone(const Options& options, int rank, int world) {
  trainyard::JobSpec spec;
  try {
    spec = trainyard::LoadJobSpec(options.job_file);
    ApplyOverrides(options, &spec);
  } catch (const trainyard::SpecError& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());  // every rank read the same file
    return 2;
  }
  RankResult result = RunJobOn(std::move(spec), MPI_COMM_WORLD, LocalRank(), nullptr);
  if (result.abort_world && world > 1) MPI_Abort(MPI_COMM_WORLD, 1);  // the others may be inside a collective
  return result.exit_code;
}

// --- Pool mode ---

std::atomic<bool> g_pool_stop{false};
std::atomic<bool> g_pool_busy{false};

// Idle ranks leave the pool cleanly; a rank running a job dies of the signal, as it
// would without the handler (mpirun's way to tear a world down).
void OnPoolSignal(int signal) {
  if (g_pool_busy) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
  g_pool_stop = true;
}

std::string Hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// One id for the whole mpirun, chosen by world rank 0.
std::string WorldId(int rank) {
  char id[64] = {};
  if (rank == 0) {
    std::random_device random;
    std::snprintf(id, sizeof id, "%s-%d-%04x", Hostname().c_str(), int(::getpid()), random() & 0xffff);
  }
  MPI_Bcast(id, sizeof id, MPI_CHAR, 0, MPI_COMM_WORLD);
  return id;
}

// The job's ranks only: MPI_Comm_create_group is collective over the group, so the
// rest of the world (running other jobs, or idle) is not involved.
MPI_Comm CreateJobComm(const std::vector<int>& world_ranks, int64_t job_id) {
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, static_cast<int>(world_ranks.size()), world_ranks.data(), &group);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_create_group(MPI_COMM_WORLD, group, static_cast<int>(job_id % 30000), &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return comm;
}

RankResult RunAssignment(const trainyard::Assignment& a, int local_rank, trainyard::PoolAgent* agent) {
  trainyard::LogInfo(trainyard::StrFormat("job %ld attempt %d: starting on %zu rank(s)%s", long(a.job_id), a.attempt,
                                          a.ranks.size(), a.resume ? ", resuming from its latest checkpoint" : ""));
  MPI_Comm comm = CreateJobComm(a.ranks, a.job_id);
  RankResult result;
  try {
    trainyard::JobSpec spec = trainyard::ParseJobSpec(a.yaml, a.source, a.base_dir);
    spec.log.runs_dir = a.runs_dir;
    spec.log.progress = false;
    if (a.resume) spec.checkpoint.resume = "auto";
    result = RunJobOn(std::move(spec), comm, local_rank, agent);
  } catch (const trainyard::SpecError& e) {  // the coordinator checked it; its files may have changed since
    result = Failed(2, "bad_input", e.what());
  }
  if (!result.abort_world) MPI_Comm_free(&comm);
  trainyard::LogInfo(trainyard::StrFormat("job %ld attempt %d: %s%s%s", long(a.job_id), a.attempt,
                                          result.outcome.outcome.c_str(), result.outcome.message.empty() ? "" : ": ",
                                          result.outcome.message.c_str()));
  return result;
}

int RunPool(const Options& o, int rank, int world, int supervisor_fd) {
  trainyard::RankIdentity self;
  self.world = WorldId(rank);
  self.rank = rank, self.world_size = world, self.host = Hostname(), self.pid = ::getpid();
  self.device = torch::cuda::is_available() ? "cuda" : "cpu";
  const int local_rank = LocalRank();
  trainyard::TellSupervisor(supervisor_fd, self);
  std::signal(SIGTERM, OnPoolSignal);
  std::signal(SIGINT, OnPoolSignal);
  trainyard::PoolAgent agent({o.coordinator, o.heartbeat_s, o.liveness}, self);
  if (rank == 0)
    trainyard::LogInfo(trainyard::StrFormat("world %s: %d rank(s) joined the pool at %s", self.world.c_str(), world,
                                            o.coordinator.c_str()));
  while (auto assignment = agent.WaitForAssignment(g_pool_stop)) {
    g_pool_busy = true;
    agent.Begin(*assignment);
    RankResult result = RunAssignment(*assignment, local_rank, &agent);
    agent.Finish(result.outcome);
    g_pool_busy = false;
    if (result.abort_world) {  // report first: the abort takes the whole world down
      agent.Drain(5);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  agent.Drain(5);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trainyard worker: runs a finetune, benchmark or inference job described by a YAML file.\n"
               "Standalone: worker JOB.yaml (one rank), or mpirun -n N worker JOB.yaml\n"
               "(data-parallel over N ranks; train.batch_size is per rank).\n"
               "Pool: mpirun -n N worker --coordinator ENDPOINT registers every rank with the coordinator\n"
               "and runs the jobs it assigns, each on its own sub-communicator; outputs go to the\n"
               "coordinator's runs folder, <runs>/<job id>/<job name>/.\n"
               "Rank 0 writes runs/<job name>/: finetune {epochs.csv,steps.jsonl,summary.json,checkpoints/,model/},\n"
               "benchmark {benchmark.csv,benchmark.md,*.svg,env.json}, inference {predictions.tsv,summary.json}."};
  Options o;
  auto* job = app.add_option("job", o.job_file, "job YAML file (see configs/jobs/langid_tiny.yaml)");
  auto* pool = app.add_option("--coordinator", o.coordinator,
                              "join the worker pool of the coordinator at this endpoint instead of running a job file");
  job->excludes(pool);
  app.add_option("--heartbeat", o.heartbeat_s, "pool: seconds between heartbeats (default 1)")
      ->check(CLI::Range(0.05, 60.0));
  app.add_option("--liveness", o.liveness,
                 "pool: missed coordinator heartbeats before reconnecting, with backoff (default 3)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--runs-dir", o.runs_dir, "standalone: folder for runs/<job>/ (default: log.runs_dir, else ./runs)");
  app.add_option("--resume", o.resume, "standalone: none, auto (latest valid checkpoint) or a checkpoint file");
  app.add_option("--threads", o.threads, "standalone: intra-op threads per rank (0: libtorch default)");
  app.add_option("--max-steps", o.max_steps, "standalone: stop after this many steps (0: no limit)");
  app.add_flag("--no-progress", o.no_progress, "standalone: no progress line while an epoch runs (pools never draw one)");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (o.job_file.empty() && o.coordinator.empty()) {
    std::fprintf(stderr, "error: give a job file, or --coordinator ENDPOINT to join a worker pool\n%s",
                 app.help().c_str());
    return 2;
  }
  if (!o.coordinator.empty()) {
    try {
      trainyard::CheckEndpoint(o.coordinator);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
  }
  trainyard::LogSetup(o.log_level);
  // Before MPI_Init and before any thread starts: fork() is only safe then.
  const int supervisor_fd = o.coordinator.empty() ? -1 : trainyard::ForkRankSupervisor(o.coordinator);

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
  int code = o.coordinator.empty() ? RunStandalone(o, rank, world) : RunPool(o, rank, world, supervisor_fd);
  MPI_Finalize();
  return code;
}
