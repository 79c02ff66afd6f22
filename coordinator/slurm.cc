#include "coordinator/slurm.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "common/clock.h"
#include "common/subprocess.h"

namespace trainyard {
namespace {

constexpr double kCommandTimeoutS = 20;

CommandOptions Deadline(std::vector<std::pair<std::string, std::string>> env = {}) {
  CommandOptions options;
  options.timeout_s = kCommandTimeoutS;
  options.env = std::move(env);
  return options;
}

// `text` as one word for bash: single-quoted, with each ' written as '\''.
std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string SlurmWorld(const std::string& slurm_job) { return "slurm-" + slurm_job; }

std::string SlurmJobOfWorld(const std::string& world) {
  if (world.rfind("slurm-", 0) != 0 || world.size() == 6) return "";
  const std::string id = world.substr(6);
  return std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; }) ? id : "";
}

std::string SbatchScript(const SlurmOptions& o, const SlurmSubmission& s) {
  std::ostringstream out;
  out << "#!/bin/bash\n"
      << "# Trainyard job " << s.job << " '" << s.name << "', attempt " << s.attempt
      << (s.replica >= 0 ? ", elastic replica " + std::to_string(s.replica) : std::string())
      << ": one Slurm job, submitted by `coordinator --slurm`.\n"
      << "# Its rank 0 registers with the coordinator with the world token that sbatch's\n"
      << "# environment carries (TRAINYARD_WORLD_TOKEN); no secret is written here.\n"
      << "#SBATCH --job-name=trainyard-" << s.job
      << (s.replica >= 0 ? "-replica-" + std::to_string(s.replica) : std::string()) << "\n"
      << "#SBATCH --ntasks=" << s.ranks << "\n";
  if (s.replica >= 0) out << "#SBATCH --nodes=1\n";  // an elastic replica is one host's ranks
  if (!o.partition.empty()) out << "#SBATCH --partition=" << o.partition << "\n";
  if (!o.account.empty()) out << "#SBATCH --account=" << o.account << "\n";
  if (o.time_limit_minutes > 0) out << "#SBATCH --time=" << o.time_limit_minutes << "\n";
  if (s.gpus) out << "#SBATCH --gpus-per-task=1\n";
  // Ahead of the time limit every rank gets SIGUSR1: they stop after the step in
  // progress, write a checkpoint and report the attempt preempted, which the
  // coordinator requeues without counting a restart.
  if (o.signal_lead_s > 0) out << "#SBATCH --signal=USR1@" << o.signal_lead_s << "\n";
  // The coordinator decides retries (Note [Attempts as Slurm jobs]). Slurm's own output
  // file would have to exist before the script runs, on a node whose disk may not
  // have the folder: the script makes it and writes its log there itself.
  out << "#SBATCH --no-requeue\n"
      << "#SBATCH --output=/dev/null\n"
      << "set -e\n"
      << "mkdir -p " << Quoted(s.folder) << "\n"
      << "exec >> " << Quoted(s.folder) << "\"/slurm-$SLURM_JOB_ID.out\" 2>&1\n"
      << "echo \"Slurm job $SLURM_JOB_ID: $SLURM_NTASKS tasks on $SLURM_JOB_NODELIST\"\n"
      << "srun --kill-on-bad-exit=1 " << Quoted(o.worker) << " --coordinator " << Quoted(o.endpoint);
  if (o.insecure)
    out << " --insecure";
  else
    out << " --keys " << Quoted(o.keys_dir);
  out << " --slurm\n";
  return out.str();
}

bool SlurmJobState::ended() const {
  if (state.empty()) return true;  // Slurm no longer lists it
  static const char* const kEnded[] = {"COMPLETED",     "CANCELLED", "FAILED",   "TIMEOUT", "NODE_FAIL",   "PREEMPTED",
                                       "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"};
  return std::find(std::begin(kEnded), std::end(kEnded), state) != std::end(kEnded);
}

std::string SlurmJobState::Describe() const {
  if (state.empty()) return "no longer listed by squeue";
  return reason.empty() || reason == "None" ? state : state + " (" + reason + ")";
}

std::map<std::string, SlurmJobState> ParseSqueue(const std::string& text) {
  std::map<std::string, SlurmJobState> jobs;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find('|'), b = a == std::string::npos ? a : line.find('|', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a);
    if (id.empty() || !std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    jobs[id] = SlurmJobState{line.substr(a + 1, b - a - 1), line.substr(b + 1)};
  }
  return jobs;
}

std::string SlurmUnreachable() {
  const CommandResult ping = RunCommand({"scontrol", "ping"}, Deadline());
  if (ping.ok() && ping.out.find("UP") != std::string::npos) return "";
  return "`scontrol ping` says slurmctld is not reachable (" + ping.Describe() + ")";
}

SlurmClient::SlurmClient(SlurmOptions options) : options_(std::move(options)), thread_([this] { Loop(); }) {}

SlurmClient::~SlurmClient() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quitting_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void SlurmClient::Submit(const SlurmSubmission& s, const std::string& script_path, const std::string& token) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_.push_back({s, script_path, token, ""});
  }
  wake_.notify_all();
}

void SlurmClient::Cancel(const std::string& slurm_job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_.push_back({{}, "", "", slurm_job});
  }
  wake_.notify_all();
}

void SlurmClient::Watch(const std::set<std::string>& slurm_jobs) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_ = slurm_jobs;
}

std::vector<SlurmClient::Submitted> SlurmClient::TakeSubmitted() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Submitted> out;
  out.swap(submitted_);
  return out;
}

std::map<std::string, SlurmJobState> SlurmClient::States() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return states_;
}

void SlurmClient::Loop() {
  Clock::time_point polled{};
  for (;;) {
    std::optional<Request> request;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return quitting_ || !requests_.empty(); });
      if (quitting_) return;
      if (!requests_.empty()) {
        request = std::move(requests_.front());
        requests_.pop_front();
      }
    }
    if (request && !request->cancel.empty()) {
      const CommandResult r = RunCommand({"scancel", request->cancel}, Deadline());
      if (!r.ok()) spdlog::warn("scancel {}: {}", request->cancel, r.Describe());
    } else if (request) {
      const CommandResult r =
          RunCommand({"sbatch", "--parsable", request->script}, Deadline({{"TRAINYARD_WORLD_TOKEN", request->token}}));
      Submitted done{request->submission.job, request->submission.attempt, "", "", request->submission.replica};
      // --parsable: "<id>" or "<id>;<cluster>".
      const std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
      if (r.ok() && !id.empty() && std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; }))
        done.slurm_job = id;
      else
        done.error = "sbatch " + r.Describe();
      std::lock_guard<std::mutex> lock(mutex_);
      submitted_.push_back(done);
    }
    if (SecondsSince(polled) >= options_.poll_s) {
      polled = Clock::now();
      Poll();
    }
  }
}

void SlurmClient::Poll() {
  std::set<std::string> watched;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watched = watched_;
  }
  if (watched.empty()) return;
  // Every job of this user, ended ones too (Slurm lists them for MinJobAge after): one
  // call, and no error for an id Slurm has forgotten.
  const CommandResult r =
      RunCommand({"squeue", "-h", "-t", "all", "-u", std::to_string(::getuid()), "-o", "%i|%T|%r"}, Deadline());
  if (!r.ok()) {
    spdlog::warn("squeue: {}", r.Describe());
    return;
  }
  std::map<std::string, SlurmJobState> all = ParseSqueue(r.out), ours;
  for (const std::string& id : watched) {
    auto it = all.find(id);
    ours[id] = it != all.end() ? it->second : SlurmJobState{};
  }
  std::lock_guard<std::mutex> lock(mutex_);
  states_ = std::move(ours);
}

}  // namespace trainyard
