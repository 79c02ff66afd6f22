#include "worker/runtime/job_runner.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "common/log.h"
#include "worker/comm/mpi_communicator.h"
#ifdef TRAINYARD_WITH_NCCL
#include "worker/comm/nccl_communicator.h"
#endif
#include "worker/jobs/benchmark.h"
#include "worker/jobs/generate.h"
#include "worker/jobs/inference.h"
#include "worker/jobs/serve.h"
#include "worker/jobs/trainer.h"

namespace trainyard {
namespace {

// NCCL for CUDA jobs when it was built in (or asked for), MPI otherwise. Throws
// InputError when the job asks for NCCL where it cannot run.
bool ChooseNccl(const JobSpec& spec) {
  const bool cuda_job = spec.runtime.device != DeviceChoice::kCpu && torch::cuda::is_available();
#ifdef TRAINYARD_WITH_NCCL
  const bool built = true;
#else
  const bool built = false;
#endif
  if (spec.distributed.backend == CommBackend::kNccl) {
    if (!cuda_job) throw InputError(spec.Where("distributed.backend") + ": nccl needs a CUDA job and a visible GPU");
    if (!built) throw InputError(spec.Where("distributed.backend") + ": this build has no NCCL");
    return true;
  }
  return spec.distributed.backend == CommBackend::kAuto && cuda_job && built;
}

// Builds the job's runner on every rank; if any rank rejects its input, all throw
// InputError (the rank at fault with its message).
template <typename Runner>
std::unique_ptr<Runner> MakeRunner(JobSpec spec, const RankContext& ranks) {
  std::unique_ptr<Runner> runner;
  std::string error;
  try {
    runner = std::make_unique<Runner>(std::move(spec), ranks);
  } catch (const InputError& e) {
    error = e.what();
  }
  const bool failed = ranks.comm ? ranks.comm->AnyTrue(!error.empty(), "input check") : !error.empty();
  if (failed) throw InputError(error.empty() ? "" : error);  // empty: another rank is at fault
  return runner;
}

template <typename Runner>
nlohmann::json RunKind(JobSpec spec, const RankContext& ranks) {
  auto runner = MakeRunner<Runner>(std::move(spec), ranks);
  nlohmann::json summary = runner->Run();
  if (ranks.rank == 0 && summary.contains("model_dir"))
    LogInfo("done: " + runner->run_dir() + " (model in " + summary["model_dir"].get<std::string>() + ")");
  return summary;
}

// The given signals set a flag while it lives, and the handlers before it come back
// after. Only the jobs that stop gracefully on a signal take them (RunKindOf); every
// other job keeps the defaults (the process ends, and mpirun with it).
class StopSignals {
 public:
  explicit StopSignals(std::vector<int> signals) : signals_(std::move(signals)), old_(signals_.size()) {
    if (!kept_from_start_) raised_ = false;
    for (size_t i = 0; i < signals_.size(); ++i) Catch(signals_[i], &old_[i]);
  }
  // KeepSchedulerSignalsFromNow: caught for good, and a signal already caught stays raised.
  static void KeepFromNow(const std::vector<int>& signals) {
    kept_from_start_ = true;
    for (int signal : signals) Catch(signal, nullptr);
  }
  ~StopSignals() {
    for (size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static const std::atomic<bool>* flag() { return &raised_; }
  static bool kept_from_start() { return kept_from_start_; }

 private:
  static void Catch(int signal, struct sigaction* old) {
    struct sigaction action {};
    action.sa_handler = [](int) { raised_ = true; };
    ::sigemptyset(&action.sa_mask);
    ::sigaction(signal, &action, old);
  }

  static inline std::atomic<bool> raised_{false};
  static inline bool kept_from_start_ = false;
  std::vector<int> signals_;
  std::vector<struct sigaction> old_;
};

// A serve job serves until SIGINT or SIGTERM.
nlohmann::json RunServe(JobSpec spec, RankContext ranks) {
  StopSignals signals({SIGINT, SIGTERM});
  ranks.stop_signal = StopSignals::flag();
  return RunKind<ServeRunner>(std::move(spec), ranks);
}

// A standalone fine-tune job stops after the step in progress on SIGTERM (a scheduler's
// preemption: Slurm sends it before SIGKILL) or SIGUSR1 (a warning ahead of a time
// limit: sbatch --signal), writes a checkpoint there and exits as preempted; so does
// every rank of an attempt run as a Slurm job (KeepSchedulerSignalsFromNow, on each rank
// alike, so that the stop agrees). In a pool the pool owns the signals, and the
// coordinator's stop comes through the hooks.
nlohmann::json RunFinetune(JobSpec spec, RankContext ranks) {
  if (ranks.elastic) return MakeRunner<Trainer>(std::move(spec), ranks)->RunElastic(*ranks.elastic);  // a pool's
  if (spec.distributed.elastic.enabled())
    throw InputError(spec.Where("distributed.elastic.max_replicas") +
                     ": elastic replicas agree on each step through a coordinator: submit the job to one (jobctl "
                     "submit), whose pool runs its replicas");
  if (ranks.hooks && !StopSignals::kept_from_start()) return RunKind<Trainer>(std::move(spec), ranks);
  StopSignals signals({SIGTERM, SIGUSR1});
  ranks.stop_signal = StopSignals::flag();
  return RunKind<Trainer>(std::move(spec), ranks);
}

nlohmann::json RunKindOf(JobSpec spec, const RankContext& ranks) {
  switch (spec.kind) {
    case JobKind::kFinetune:
      return RunFinetune(std::move(spec), ranks);
    case JobKind::kBenchmark:
      return RunKind<BenchmarkRunner>(std::move(spec), ranks);
    case JobKind::kInference:
      return RunKind<InferenceRunner>(std::move(spec), ranks);
    case JobKind::kGenerate:
      return RunKind<GenerateRunner>(std::move(spec), ranks);
    case JobKind::kServe:
      return RunServe(std::move(spec), ranks);
  }
  throw std::logic_error("unknown job kind");
}

}  // namespace

void KeepSchedulerSignalsFromNow() { StopSignals::KeepFromNow({SIGTERM, SIGUSR1}); }

namespace {

RankResult Failed(int code, JobEnd end, const std::string& message) {
  RankResult r;
  r.exit_code = code;
  r.outcome.end = end;
  r.outcome.message = message;
  return r;
}

}  // namespace

int LocalRank() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  return local;
}

RankResult RunJobOn(JobSpec spec, MPI_Comm comm, int local_rank, JobHooks* hooks, const ElasticRun* elastic) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  std::unique_ptr<MpiCommunicator> mpi;
  std::unique_ptr<Communicator> nccl;
  try {
    const bool use_nccl = ChooseNccl(spec);
    // One rank has no communicator, unless the job names NCCL: then it runs the
    // data-parallel path (reducer and NCCL) alone, as one rank of a larger job would.
    const bool data_parallel = world > 1 || (use_nccl && spec.distributed.backend == CommBackend::kNccl);
    if (data_parallel) mpi = std::make_unique<MpiCommunicator>(comm, spec.distributed.timeout_s);
    if (mpi && hooks) mpi->SetAbortNotice([hooks](const std::string& error) { hooks->Aborting(error); });
#ifdef TRAINYARD_WITH_NCCL
    if (data_parallel && use_nccl)
      nccl = std::make_unique<NcclCommunicator>(*mpi, local_rank % VisibleGpus(), spec.distributed.timeout_s);
#else
    (void)use_nccl;
#endif
  } catch (const InputError& e) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return Failed(2, JobEnd::kBadInput, e.what());
  }
  Communicator* communicator = nccl ? nccl.get() : static_cast<Communicator*>(mpi.get());
  RankContext ranks{rank, world, local_rank, communicator, hooks};
  if (elastic) {
    ranks.elastic = elastic;
    ranks.elastic_replicas = spec.distributed.elastic.max_replicas;
  }
  try {
    nlohmann::json summary = RunKindOf(std::move(spec), ranks);
    RankResult result;
    if (rank == 0) result.outcome.summary_json = summary.dump();
    return result;
  } catch (const InputError& e) {
    if (*e.what()) std::fprintf(stderr, "error: %s\n", e.what());
    return Failed(2, JobEnd::kBadInput, *e.what() ? e.what() : "another rank of the job rejected its input");
  } catch (const JobPreempted& e) {
    LogInfo(e.what());
    return Failed(kPreemptedExitCode, JobEnd::kPreempted, e.what());
  } catch (const JobStopped& e) {
    LogInfo(e.what());
    return Failed(1, JobEnd::kCancelled, e.what());
  } catch (const std::exception& e) {
    LogError("rank " + std::to_string(rank) + ": job failed: " + e.what());
    RankResult result = Failed(1, JobEnd::kFailed, e.what());
    result.abort_world = world > 1;
    return result;
  }
}

}  // namespace trainyard
