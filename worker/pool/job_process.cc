#include "worker/pool/job_process.h"

#include <fcntl.h>
#include <poll.h>
#include <re2/re2.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/log.h"
#include "worker/pool/output_lines.h"

extern char** environ;

namespace trainyard {
namespace {

constexpr size_t kTailLines = 40;
constexpr size_t kMaxLineBytes = 400;
constexpr double kOutputAfterExitS = 3;  // how long the output may stay open once mpirun is gone

bool StartsWith(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// What mpirun sets for the processes it starts: the job's mpirun must not see it.
bool SetByMpirun(const std::string& name) {
  if (StartsWith(name, "PMIX_")) return true;
  if (!StartsWith(name, "OMPI_")) return false;
  if (StartsWith(name, "OMPI_ALLOW_RUN_AS_ROOT")) return false;  // the user's consent, kept
  if (!StartsWith(name, "OMPI_MCA_")) return true;               // OMPI_COMM_WORLD_RANK, ...
  for (const char* launch : {"OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir",
                             "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_MCA_mpi_oversubscribe"})
    if (StartsWith(name, launch)) return true;
  return false;  // the user's own MCA settings
}

std::string JoinInts(const std::vector<int>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) text += (i ? "," : "") + std::to_string(values[i]);
  return text;
}

}  // namespace

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::vector<std::string> MpirunCommand(const JobLaunch& launch) {
  if (launch.hosts.empty() || launch.hosts.size() != launch.slots.size())
    throw std::invalid_argument("a job launch needs one host and one slot per rank");
  // Group the ranks by host, in order of first appearance: mpirun fills each host's
  // slots in turn, so this is where each job rank will run.
  std::vector<std::string> order;
  for (const std::string& host : launch.hosts)
    if (std::find(order.begin(), order.end(), host) == order.end()) order.push_back(host);
  std::string host_list;
  std::vector<int> slots;
  for (const std::string& host : order) {
    int count = 0;
    for (size_t i = 0; i < launch.hosts.size(); ++i)
      if (launch.hosts[i] == host) {
        ++count;
        slots.push_back(launch.slots[i]);
      }
    host_list += (host_list.empty() ? "" : ",") + host + ":" + std::to_string(count);
  }
  std::vector<std::string> argv{launch.mpirun};
  if (launch.allow_run_as_root) argv.push_back("--allow-run-as-root");
  // More than one rank: each line says whose it is (output_lines.h).
  if (launch.hosts.size() > 1) argv.push_back("--tag-output");
  argv.insert(argv.end(), {"--oversubscribe", "--bind-to", "none", "--host", host_list, "-n",
                           std::to_string(launch.hosts.size()), launch.worker, "--pool-job", launch.relay,
                           "--job-slots", JoinInts(slots), "--job-id", std::to_string(launch.job_id)});
  argv.insert(argv.end(), launch.extra_args.begin(), launch.extra_args.end());
  return argv;
}

std::vector<std::string> ScrubbedEnvironment(const std::vector<std::string>& environment) {
  std::vector<std::string> kept;
  for (const std::string& entry : environment)
    if (!SetByMpirun(entry.substr(0, entry.find('=')))) kept.push_back(entry);
  return kept;
}

RankEnd ParseMpirunReport(const std::vector<std::string>& lines) {
  // RE2, not std::regex: these lines are the job's output, and RE2's time is linear in them.
  static const RE2 signaled(R"(process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+))");
  static const RE2 process(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
  static const RE2 exit_code(R"(Exit code:\s+(\d+))");
  static const RE2 lost(R"(Remote daemon: \[\[[0-9,]+\],\d+\] on node (\S+))");
  RankEnd end;
  int rank = 0, signal = 0, code = 0;
  std::string node;
  for (const std::string& line : lines) {
    if (end.lost_host.empty()) RE2::PartialMatch(line, lost, &end.lost_host);
    if (RE2::PartialMatch(line, signaled, &rank, &node, &signal)) {
      end.rank = rank;
      end.node = node;
      end.signal = signal;
      return end;
    }
    if (RE2::PartialMatch(line, process, &rank)) end.rank = rank;
    if (end.rank >= 0 && RE2::PartialMatch(line, exit_code, &code)) end.exit_code = code;
  }
  return end;
}

JobProcess::JobProcess(const JobLaunch& launch, LineSink on_line) : on_line_(std::move(on_line)) {
  const std::vector<std::string> argv_text = MpirunCommand(launch);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
  env_text = ScrubbedEnvironment(env_text);
  std::vector<char*> argv, envp;
  for (const auto& a : argv_text) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {  // only async-signal-safe calls from here to exec
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);             // a terminal's Ctrl-C reaches the agent, which decides
    ::signal(SIGPIPE, SIG_IGN);  // Note [Job isolation]: a late write at mpirun's shutdown
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close_range(3, ~0U, 0);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char message[] = "error: cannot run mpirun for the job\n";
    ssize_t unused = ::write(2, message, sizeof message - 1);
    (void)unused;
    ::_exit(127);
  }
  ::close(fds[1]);
  const int read_fd = fds[0];
  const bool tagged = launch.hosts.size() > 1;
  reader_ = std::thread([this, read_fd, tagged] { ReadOutput(read_fd, tagged); });
}

JobProcess::~JobProcess() {
  if (!Exited()) {
    Kill();
    while (!Exited()) ::usleep(10000);
  }
  if (reader_.joinable()) reader_.join();
}

void JobProcess::ReadOutput(int fd, bool tagged) {
  OutputLines splitter(tagged);
  std::vector<OutputLine> lines;
  char buffer[4096];
  for (bool open = true; open;) {
    ssize_t n = 0;
    if (stop_reading_) {
      open = false;
    } else {
      pollfd ready{fd, POLLIN, 0};
      if (::poll(&ready, 1, 100) == 0) continue;
      n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      open = n > 0;
    }
    if (open)
      splitter.Feed(std::string_view(buffer, static_cast<size_t>(n)), &lines);
    else
      splitter.Finish(&lines);
    for (OutputLine& line : lines) TakeOutputLine(std::move(line));
    lines.clear();
  }
  ::close(fd);
  std::lock_guard<std::mutex> lock(mutex_);
  output_done_ = true;
}

void JobProcess::TakeOutputLine(OutputLine line) {
  std::string rendered = RenderedLine(line) + "\n";
  ssize_t unused = ::write(2, rendered.data(), rendered.size());  // the job's log, as it comes
  (void)unused;
  rendered.pop_back();
  if (on_line_) on_line_(rendered);
  if (line.text.size() > kMaxLineBytes) line.text.resize(kMaxLineBytes);
  TakeLine(std::move(line.text));
}

void JobProcess::TakeLine(std::string line) {
  const bool blank = line.find_first_not_of(" \t") == std::string::npos;
  const bool rule = !blank && line.find_first_not_of('-') == std::string::npos;
  std::lock_guard<std::mutex> lock(mutex_);
  if (rule || blank) {  // mpirun's frames, kept out of the tail
    after_rule_ = after_rule_ || rule;
    return;
  }
  if (after_rule_ && mpirun_message_.empty()) mpirun_message_ = line;
  after_rule_ = false;
  // Open MPI's words (4.1) when it starts to bring a job down after a rank failed.
  for (const char* words :
       {"MPI_ABORT was invoked", "terminated normally, but", "exited on signal", "lost communication with"})
    if (line.find(words) != std::string::npos && !ending_since_) ending_since_ = Clock::now();
  RememberLogLine(line);
  tail_.push_back(std::move(line));
  if (tail_.size() > kTailLines) tail_.pop_front();
}

std::optional<Clock::time_point> JobProcess::EndingSince() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ending_since_;
}

std::string JobProcess::MpirunMessage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mpirun_message_;
}

bool JobProcess::Exited() {
  if (!exited_) {
    const pid_t done = ::waitpid(pid_, &status_, WNOHANG);
    if (done == pid_) {
      exited_ = true;
      reaped_at_ = Clock::now();
    }
  }
  if (!exited_) return false;
  if (SecondsSince(*reaped_at_) > kOutputAfterExitS) stop_reading_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  return output_done_;
}

namespace {

// The children of `pid` (Linux: /proc/<pid>/task/<tid>/children of every thread).
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> children;
  std::error_code error;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
    std::ifstream in(task.path() / "children");
    for (pid_t child = 0; in >> child;) children.push_back(child);
  }
  return children;
}

}  // namespace

void JobProcess::Terminate() {
  if (exited_) return;
  children_ = ChildrenOf(pid_);
  ::kill(pid_, SIGTERM);
}

void JobProcess::Kill() {
  // mpirun leads a process group of its own, but starts its ssh to other hosts each in
  // a group of its own; orphaned, they would hold the output open and outlive the job.
  ::kill(-pid_, SIGKILL);
  if (!exited_) ::kill(pid_, SIGKILL);
  for (pid_t child : children_) ::kill(child, SIGKILL);
}

bool JobProcess::Succeeded() const { return exited_ && WIFEXITED(status_) && WEXITSTATUS(status_) == 0; }

std::string JobProcess::ExitText() const {
  if (WIFSIGNALED(status_))
    return "was killed by signal " + std::to_string(WTERMSIG(status_)) + " (" + SignalName(WTERMSIG(status_)) + ")";
  return "exited with code " + std::to_string(WEXITSTATUS(status_));
}

std::vector<std::string> JobProcess::OutputTail() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {tail_.begin(), tail_.end()};
}

}  // namespace trainyard
