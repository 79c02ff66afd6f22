#include "worker/runtime/pool_runtime.h"

#include <mpi.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>

#include "common/log.h"
#include "worker/pool/job_relay.h"
#include "worker/pool/rank_supervisor.h"
#include "worker/pool/relay_quorum_link.h"
#include "worker/runtime/job_runner.h"
#ifdef TRAINYARD_WITH_ELASTIC
#include <arpa/inet.h>
#include <netdb.h>

#include "worker/elastic/tcp_ring.h"
#include "worker/jobs/trainer.h"
#endif

namespace trainyard {
namespace {

constexpr int kHostChars = 256;
constexpr double kAssignmentWaitS = 60;
// A Slurm job's rank 0 may register before the coordinator has read sbatch's answer, or
// while it restarts.
constexpr double kSlurmAssignmentWaitS = 120;

std::atomic<bool> g_pool_stop{false};
std::atomic<bool> g_pool_busy{false};

// Idle agents leave the pool cleanly; an agent with a job dies of the signal, as it
// would without the handler (mpirun's way to tear a world down), and its job's mpirun
// with it (PR_SET_PDEATHSIG).
void OnPoolSignal(int signal) {
  if (g_pool_busy) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
  g_pool_stop = true;
}

std::string Hostname() {
  char name[kHostChars] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// The agent's world: an id of its own (host, pid and 16 random bits, for people to
// read; uniqueness rests on the pid and the random bits) and a world token.
void ChooseWorld(RankIdentity* self) {
  std::random_device random;
  char id[kHostChars + 32] = {};
  std::snprintf(id, sizeof id, "%s-%d-%04x", Hostname().c_str(), int(::getpid()), random() & 0xffff);
  self->world = id;
  self->world_token = NewSecretToken();
}

// Job rank 0 learns every job rank's pid and host, for the agent's failure reports.
std::vector<JobRankProcess> GatherProcesses(int rank, int world) {
  char host[kHostChars] = {};
  std::snprintf(host, sizeof host, "%s", Hostname().c_str());
  int64_t pid = ::getpid();
  std::vector<char> hosts(static_cast<size_t>(world) * kHostChars);
  std::vector<int64_t> pids(static_cast<size_t>(world));
  MPI_Gather(host, kHostChars, MPI_CHAR, hosts.data(), kHostChars, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Gather(&pid, 1, MPI_INT64_T, pids.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::vector<JobRankProcess> processes;
  if (rank == 0)
    for (int r = 0; r < world; ++r)
      processes.push_back({pids[static_cast<size_t>(r)], &hosts[static_cast<size_t>(r) * kHostChars]});
  return processes;
}

// Rank 0's bytes on every rank (empty when rank 0 has none).
std::string Broadcast(std::string bytes, int rank) {
  int64_t size = rank == 0 ? static_cast<int64_t>(bytes.size()) : 0;
  MPI_Bcast(&size, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  bytes.resize(static_cast<size_t>(size));
  if (size > 0) MPI_Bcast(bytes.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  return bytes;
}

#ifdef TRAINYARD_WITH_ELASTIC
// Where this host's replica ring listens, as its peers reach it: the first IPv4 address
// its name resolves to that is not loopback, else a loopback one (a pool on one host).
std::string RingHost() {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  std::string host = "127.0.0.1";
  if (::getaddrinfo(Hostname().c_str(), nullptr, &hints, &found) != 0) return host;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    if (!::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) continue;
    host = text;
    if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) break;
  }
  ::freeaddrinfo(found);
  return host;
}

// A replica of an elastic attempt (Note [Elastic finetune]): on its rank 0, its ring's
// listener, and its quorum reached through `quorum` (the agent that leads it, or its
// own); a replica's other ranks (`quorum` null) follow its rank 0 (Note [Elastic replica
// of several ranks]).
RankResult RunReplica(JobSpec spec, int replica, int local_rank, JobHooks* hooks, QuorumChannel* quorum) {
  // Replicas that share a host (a pool's slots) each keep a run folder of their own, and
  // one that replaces a lost replica on the same slot does not write over its files.
  spec.log.runs_dir += "/replica-" + std::to_string(replica);
  const double timeout_s = spec.distributed.timeout_s;
  if (!quorum) {
    const ElasticRun follower{nullptr, nullptr, timeout_s, ""};
    return RunJobOn(std::move(spec), MPI_COMM_WORLD, local_rank, hooks, &follower);
  }
  const std::string host = RingHost();
  std::unique_ptr<RingListener> made;
  try {
    made = std::make_unique<RingListener>(host, 0);
  } catch (const std::exception& e) {
    RankResult failed;
    failed.exit_code = 1;
    failed.outcome.end = JobEnd::kFailed;
    failed.outcome.message = std::string("the replica's ring cannot listen: ") + e.what();
    failed.abort_world = true;  // its other ranks wait on it
    return failed;
  }
  RingListener& listener = *made;
  RelayQuorumLink link(*quorum, {host, listener.port(), 1.0, std::max(60.0, 2 * timeout_s), timeout_s + 30});
  const ElasticRun elastic{&link, &listener, timeout_s, ""};
  return RunJobOn(std::move(spec), MPI_COMM_WORLD, local_rank, hooks, &elastic);
}
#endif

RankResult RunAssignment(const Assignment& a, int local_rank, JobHooks* hooks, QuorumChannel* quorum = nullptr) {
  RankResult result;
  try {
    JobSpec spec = ParseJobSpec(a.yaml, a.source, a.base_dir);
    spec.log.runs_dir = a.runs_dir;
    spec.log.progress = false;
    if (a.resume) spec.checkpoint.resume = "auto";
#ifdef TRAINYARD_WITH_ELASTIC
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (a.elastic_replicas > 0 && (quorum || rank > 0))  // rank 0 leads the replica; its others follow
      return RunReplica(std::move(spec), a.elastic_replica, local_rank, hooks, rank == 0 ? quorum : nullptr);
#else
    (void)quorum;
#endif
    result = RunJobOn(std::move(spec), MPI_COMM_WORLD, local_rank, hooks);
  } catch (const SpecError& e) {  // the coordinator checked it; its files may have changed since
    result.exit_code = 2;
    result.outcome.end = JobEnd::kBadInput;
    result.outcome.message = e.what();
  }
  return result;
}

// Job rank 0 of a Slurm attempt: the world the coordinator bound to this Slurm job, and
// its token from the job's environment (Note [Attempts as Slurm jobs]).
RankIdentity SlurmLead() {
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* token = std::getenv("TRAINYARD_WORLD_TOKEN");
  if (!job || !*job || !token || !*token)
    throw std::runtime_error(
        "--slurm: SLURM_JOB_ID and TRAINYARD_WORLD_TOKEN must be set (run it through the sbatch script "
        "`coordinator --slurm` generates)");
  RankIdentity self;
  self.world = std::string("slurm-") + job;
  self.world_token = token;
  self.rank_token = NewSecretToken();
  self.host = Hostname();
  self.pid = ::getpid();
  self.device = torch::cuda::is_available() ? "cuda" : "cpu";
  return self;
}

}  // namespace

int RunSlurmAttempt(const PoolOptions& options) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::unique_ptr<PoolAgent> agent;
  std::optional<Assignment> assignment;
  if (rank == 0) {
    try {
      const RankIdentity self = SlurmLead();
      agent = std::make_unique<PoolAgent>(options, self);
      LogInfo(StrFormat("Slurm job rank 0 on %s registering as world %s with the coordinator at %s", self.host.c_str(),
                        self.world.c_str(), options.endpoint.c_str()));
      const std::atomic<bool> never{false};
      assignment = agent->WaitForAssignment(never, kSlurmAssignmentWaitS);
      if (!assignment) LogError(StrFormat("the coordinator sent no assignment within %.0f s", kSlurmAssignmentWaitS));
    } catch (const std::exception& e) {
      LogError(e.what());
    }
  }
  ::unsetenv("TRAINYARD_WORLD_TOKEN");  // nothing the job starts needs it
  const std::string bytes = Broadcast(assignment ? AssignmentBytes(*assignment) : "", rank);
  if (bytes.empty()) return 1;
  const Assignment a = ParseAssignment(bytes);
  if (agent) agent->Begin(a);
  SilentHooks silent;
  std::unique_ptr<AgentHooks> hooks = agent ? std::make_unique<AgentHooks>(*agent) : nullptr;
  std::unique_ptr<AgentQuorumChannel> quorum = agent ? std::make_unique<AgentQuorumChannel>(*agent) : nullptr;
  RankResult result =
      RunAssignment(a, LocalRank(), hooks ? static_cast<JobHooks*>(hooks.get()) : &silent, quorum.get());
  if (agent) {
    agent->Finish(result.outcome);
    if (!agent->Drain(5)) LogWarn("the coordinator did not confirm this attempt's result");
  }
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (result.abort_world && world > 1) MPI_Abort(MPI_COMM_WORLD, 1);  // the others may be inside a collective
  return result.exit_code;
}

int RunPool(const PoolOptions& options, JobLaunchOptions launch, int supervisor_fd) {
  RankIdentity self;
  ChooseWorld(&self);
  self.rank_token = NewSecretToken();
  self.rank = 0;
  self.world_size = 1;
  self.slot = options.slot;
  self.host = Hostname();
  self.pid = ::getpid();
  self.device = torch::cuda::is_available() ? "cuda" : "cpu";
  TellSupervisor(supervisor_fd, self);
  std::signal(SIGTERM, OnPoolSignal);
  std::signal(SIGINT, OnPoolSignal);
  PoolAgent agent(options, self);
  LogInfo(StrFormat("agent %s (slot %d on %s, %s) joined the pool at %s", self.world.c_str(), self.slot,
                    self.host.c_str(), self.device.c_str(), options.endpoint.c_str()));
  PoolRank(agent, std::move(launch)).Serve(g_pool_stop, g_pool_busy);
  agent.Drain(5);
  return 0;
}

int RunPoolJob(const std::string& relay, const std::vector<int>& slots) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::vector<JobRankProcess> processes = GatherProcesses(rank, world);
  std::unique_ptr<RelayClient> client;
  std::string bytes;
  if (rank == 0) {
    try {
      client = std::make_unique<RelayClient>(relay);
      bytes = client->Start(processes, kAssignmentWaitS);
    } catch (const std::exception& e) {
      LogError(std::string("cannot reach the pool agent that launched this job: ") + e.what());
      bytes.clear();
    }
  }
  bytes = Broadcast(std::move(bytes), rank);
  if (bytes.empty()) return 1;
  const Assignment a = ParseAssignment(bytes);
  const int local_rank = static_cast<size_t>(rank) < slots.size() ? slots[static_cast<size_t>(rank)] : LocalRank();
  SilentHooks silent;
  RankResult result =
      RunAssignment(a, local_rank, rank == 0 ? static_cast<JobHooks*>(client.get()) : &silent, client.get());
  if (rank == 0 && !client->SendResult(result.outcome, 5))
    LogWarn("the pool agent did not confirm this job's result; it will judge by the exit code");
  if (result.abort_world && world > 1) MPI_Abort(MPI_COMM_WORLD, 1);  // the others may be inside a collective
  // A job stopped on request (a cancel, or its search) ends with every rank agreeing to
  // stop, and its agent knows the outcome: rank 0 said it, and the agent asked for the
  // stop (EndOf in pool_rank.cc). Its ranks exit 0, because mpirun answers a non-zero
  // exit by aborting the job, which takes it a second or more: time the stopped
  // attempt's slots would be held and charged for.
  if (result.outcome.end == JobEnd::kCancelled) return 0;
  return result.exit_code;
}

}  // namespace trainyard
