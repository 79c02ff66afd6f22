// The worker: `worker JOB.yaml` runs one job standalone over MPI_COMM_WORLD, one rank
// per process (`mpirun -n 4 worker JOB.yaml` trains data-parallel over 4 ranks).
// `srun worker --coordinator ENDPOINT --keys KEYS --slurm` is one rank of an attempt that
// `coordinator --slurm` submitted as a Slurm job (Note [Attempts as Slurm jobs] in
// coordinator/slurm.h); its rank 0 stands for the attempt in the coordinator's pool.
// `worker --coordinator ENDPOINT --keys KEYS` is a pool agent instead: one slot of the
// coordinator's pool, an independent process with no MPI of its own (started alone, by
// a service manager, or several at once by `mpirun -n 4`). Each job runs as its own
// mpirun of this binary with --pool-job over the slots it was given, on any hosts (Note
// [Job isolation] in worker/pool/job_process.h).
// Exit codes: 0 success, 1 failure while running, 2 bad input (job file, datasets,
// checkpoints) reported as one line naming the file, line and key, 3 a standalone
// finetune job stopped by SIGTERM or SIGUSR1 after writing its checkpoint. A pool rank exits 0
// when stopped (SIGTERM, SIGINT) while idle; the outcome of each job goes to the
// coordinator instead.
#include <mpi.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "common/log.h"
#include "common/process_exit.h"
#include "worker/pool/pool_agent.h"
#include "worker/pool/rank_supervisor.h"
#include "worker/runtime/job_runner.h"
#include "worker/runtime/pool_runtime.h"
#include "worker/runtime/standalone_runtime.h"

namespace {

struct Options {
  trainyard::StandaloneOptions standalone;
  trainyard::PoolOptions pool;
  trainyard::JobLaunchOptions launch;
  std::string pool_job;  // job mode: the lead agent's relay endpoint
  std::vector<int> job_slots;
  int64_t job_id = 0;
  std::string log_level = "info";
  bool slurm = false;  // with --coordinator: a rank of one attempt's Slurm job
};

void AddOptions(CLI::App& app, Options& o) {
  auto* job = app.add_option("job", o.standalone.job_file, "job YAML file (see configs/jobs/langid_tiny.yaml)");
  auto* pool = app.add_option("--coordinator", o.pool.endpoint,
                              "join the worker pool of the coordinator at this endpoint instead of running a job file");
  job->excludes(pool);
  app.add_option("--heartbeat", o.pool.heartbeat_s, "pool: seconds between heartbeats (default 1)")
      ->check(CLI::Range(0.05, 60.0));
  app.add_option(
         "--liveness", o.pool.liveness,
         "pool: heartbeats' worth of silence on the link to the coordinator before it is dropped and made again, "
         "with backoff (default 3)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--keys", o.pool.keys_dir,
                 "pool: key folder made by `coordinator --init` (worker.key, coordinator.pub); default\n"
                 "$TRAINYARD_KEYS, else ./keys");
  app.add_flag("--insecure", o.pool.insecure, "pool: development only, for a coordinator started with --insecure");
  app.add_option("--slot", o.pool.slot,
                 "pool: this agent's index among the agents of its host, which picks the GPU its job ranks\n"
                 "use (default: the node-local rank mpirun or srun gives it, else 0)")
      ->check(CLI::Range(0, 4096));
  app.add_flag("--allow-run-as-root", o.launch.allow_run_as_root,
               "pool: let each job's mpirun run as root (Open MPI refuses by default); implied when the\n"
               "agent itself was started by an mpirun that allowed it");
  app.add_option("--mpirun", o.launch.mpirun,
                 "pool: the mpirun that starts each job as its own MPI world (default: mpirun on PATH)");
  app.add_flag("--slurm", o.slurm,
               "with --coordinator: this process is one of the ranks srun started for an attempt that\n"
               "`coordinator --slurm` submitted (its generated sbatch script passes this); rank 0 registers\n"
               "with the world token of the job's environment and leads the attempt")
      ->needs(pool);
  // Job mode, for the pool's own use: a lead agent starts each job with these.
  auto* pool_job = app.add_option("--pool-job", o.pool_job)->group("");
  app.add_option("--job-slots", o.job_slots)->group("")->delimiter(',')->needs(pool_job);
  app.add_option("--job-id", o.job_id)->group("")->needs(pool_job);  // for `ps` only
  pool_job->excludes(job)->excludes(pool);
  app.add_option("--set", o.standalone.set,
                 "standalone: KEY.PATH=VALUE sets a key of the job file, VALUE read as YAML (repeatable; "
                 "e.g. --set train.lr=3e-5 --set eval.metrics=[f1])")
      ->allow_extra_args(false);
  app.add_option("--runs-dir", o.standalone.runs_dir,
                 "standalone: folder for runs/<job>/ (default: log.runs_dir, else ./runs)");
  app.add_option("--resume", o.standalone.resume,
                 "standalone: none, auto (latest valid checkpoint) or a checkpoint file");
  app.add_option("--threads", o.standalone.threads, "standalone: intra-op threads per rank (0: libtorch default)");
  app.add_option("--max-steps", o.standalone.max_steps, "standalone: stop after this many steps (0: no limit)");
  for (auto [flag, port, what] : {std::tuple{"--http-port", &o.standalone.http_port, "HTTP (KServe V2)"},
                                  std::tuple{"--grpc-port", &o.standalone.grpc_port, "gRPC (KServe V2)"},
                                  std::tuple{"--metrics-port", &o.standalone.metrics_port, "Prometheus /metrics"}})
    app.add_option(flag, *port,
                   std::string("serve: the ") + what + " port, instead of the job file's (0: any free port)")
        ->check(CLI::Range(0, 65535));
  app.add_flag("--no-progress", o.standalone.no_progress,
               "standalone: no progress line while an epoch or an inference pass runs (pools never draw one)");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

// `name` as a path to run (a bare name is looked up on PATH, as execvp would). Throws
// std::invalid_argument naming `option` when there is none: a pool must not accept jobs
// it cannot start.
std::string FindExecutable(const std::string& name, const char* option) {
  std::vector<std::string> candidates;
  if (name.find('/') != std::string::npos) {
    candidates.push_back(name);
  } else if (const char* path = std::getenv("PATH")) {
    std::stringstream folders(path);
    for (std::string folder; std::getline(folders, folder, ':');)
      candidates.push_back((folder.empty() ? "." : folder) + "/" + name);
  }
  for (const std::string& candidate : candidates)
    if (std::filesystem::is_regular_file(candidate) && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  throw std::invalid_argument(std::string(option) + " " + name +
                              ": no such executable (each job of the pool runs as its own mpirun)");
}

// The node-local index a launcher gave this process (mpirun, srun), or 0.
int LauncherLocalRank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "PMIX_LOCAL_RANK"})
    if (const char* value = std::getenv(name); value && *value) return std::atoi(value);
  return 0;
}

// A pool agent: no MPI at all (Note [Job isolation]), so that it is one independent
// process however it was started.
int RunPoolAgent(Options& o, bool slot_given) {
  if (!slot_given) o.pool.slot = LauncherLocalRank();
  o.pool.under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  // Started as root by an mpirun: that mpirun was allowed to, and so are the job's.
  if (::geteuid() == 0 && o.pool.under_mpirun) o.launch.allow_run_as_root = true;
  o.launch.worker = std::filesystem::read_symlink("/proc/self/exe").string();
  // Before any thread starts: fork() is only safe then.
  const int supervisor_fd = trainyard::ForkRankSupervisor(o.pool);
  return trainyard::RunPool(o.pool, o.launch, supervisor_fd);
}

// The pool's endpoint, keys and mpirun, checked; false (after saying why) if one is unusable.
bool ResolvePoolOptions(Options& o) {
  try {
    trainyard::CheckEndpoint(o.pool.endpoint);
    if (o.pool.keys_dir.empty()) o.pool.keys_dir = trainyard::DefaultKeyDir();
    if (!o.pool.insecure) o.pool.keys = trainyard::LoadPeerKeys(o.pool.keys_dir, trainyard::WireRole::kWorker);
    if (!o.slurm) o.launch.mpirun = FindExecutable(o.launch.mpirun, "--mpirun");
    return true;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const trainyard::KeyError& e) {
    std::fprintf(stderr, "error: %s (or --insecure, if the coordinator runs with it)\n", e.what());
  }
  return false;
}

int RunUnderMpi(int argc, char** argv, const Options& o, bool job_mode);

int Main(int argc, char** argv) {
  CLI::App app{
      "Trainyard worker: runs a finetune, benchmark, inference, generate or serve job described by a YAML file.\n"
      "Standalone: worker JOB.yaml (one rank), or mpirun -n N worker JOB.yaml\n"
      "(data-parallel over N ranks; train.batch_size is per rank).\n"
      "Pool: worker --coordinator ENDPOINT registers this process as one slot of the coordinator's\n"
      "pool (mpirun -n N worker --coordinator ... starts N independent agents) and runs the jobs it\n"
      "assigns, each as its own mpirun (--mpirun) over the slots it was given, so a failing job ends\n"
      "alone and a dead agent frees only its slot; outputs go to the coordinator's runs folder,\n"
      "<runs>/<job id>/<job name>/, on the job's hosts.\n"
      "Rank 0 writes runs/<job name>/: finetune {epochs.csv,steps.jsonl,curves.svg,tb/ (TensorBoard),summary.json,\n"
      "model/; trace.json with log.trace, mlflow_run.json with log.mlflow}, and the first rank of\n"
      "every host its checkpoints/ (one copy where the hosts share the folder),\n"
      "benchmark {benchmark.csv,benchmark.md,*.svg,env.json},\n"
      "inference {predictions.tsv,summary.json},"
      " generate {generations.jsonl,summary.json},\n"
      "serve {endpoints.json} (it serves until SIGINT/SIGTERM).\n"
      "A standalone finetune job stopped by SIGTERM or SIGUSR1 (a scheduler's preemption or time-limit\n"
      "warning) stops after the step in progress, writes a checkpoint and exits 3; rerun it with\n"
      "checkpoint.resume: auto to go on. Exit codes: 0 done, 1 failed, 2 bad input, 3 stopped so."};
  Options o;
  AddOptions(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const bool pool = !o.pool.endpoint.empty();
  const bool job_mode = !o.pool_job.empty();
  if (o.standalone.job_file.empty() && !pool && !job_mode) {
    std::fprintf(stderr, "error: give a job file, or --coordinator ENDPOINT to join a worker pool\n%s",
                 app.help().c_str());
    return 2;
  }
  if (pool && !ResolvePoolOptions(o)) return 2;
  trainyard::LogSetup(o.log_level);
  o.launch.job_args = {"--log-level", o.log_level};
  if (pool && !o.slurm) return RunPoolAgent(o, app.count("--slot") > 0);
  // A job's process dies with the mpirun that started it (Note [Job isolation]).
  if (job_mode) ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (o.slurm) trainyard::KeepSchedulerSignalsFromNow();  // before MPI starts: no signal is lost

  return RunUnderMpi(argc, argv, o, job_mode);
}

// A standalone job, or one pool job's rank (job_mode), as a rank of the world mpirun started.
int RunUnderMpi(int argc, char** argv, const Options& o, bool job_mode) {
  // The comm thread makes every MPI call after start-up, never two threads at once.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (provided < MPI_THREAD_SERIALIZED) {
    if (rank == 0) std::fprintf(stderr, "error: this MPI library lacks MPI_THREAD_SERIALIZED support\n");
    MPI_Finalize();
    return 1;
  }
  const int code = job_mode  ? trainyard::RunPoolJob(o.pool_job, o.job_slots)
                   : o.slurm ? trainyard::RunSlurmAttempt(o.pool)
                             : trainyard::RunStandalone(o.standalone);
  MPI_Finalize();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  int code = 1;
  try {
    code = Main(argc, argv);
  } catch (const std::exception& e) {  // the job runners catch their own; this is start-up and shut-down
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  // Every job object is gone and MPI finalized by now.
  trainyard::ExitSkippingStaticDestructors(code);
}
