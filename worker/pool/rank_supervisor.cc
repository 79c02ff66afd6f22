#include "worker/pool/rank_supervisor.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <zmq.hpp>

#include "proto/wire_version.h"
#include "trainyard.pb.h"

namespace trainyard {
namespace {

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_forwarded = 0;

void Forward(int signal) {
  if (signal != SIGCONT) g_forwarded = signal;
  if (g_child > 0) ::kill(g_child, signal);
}

// The rank's "world\trank\tsize\thost\tdevice\tpid\ttoken" line, or an empty identity if
// the rank died before writing it.
RankIdentity ReadIdentity(int fd) {
  std::string text;
  char buffer[512];
  while (text.find('\n') == std::string::npos) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  RankIdentity id;
  std::stringstream in(text.substr(0, text.find('\n')));
  std::string rank, size, pid;
  if (std::getline(in, id.world, '\t') && std::getline(in, rank, '\t') && std::getline(in, size, '\t') &&
      std::getline(in, id.host, '\t') && std::getline(in, id.device, '\t') && std::getline(in, pid, '\t') &&
      std::getline(in, id.rank_token)) {
    id.rank = std::atoi(rank.c_str());
    id.world_size = std::atoi(size.c_str());
    id.pid = std::atoll(pid.c_str());
  }
  return id;
}

// Best effort: the coordinator may be down; the rank's heartbeats stopping tells it too.
void ReportExit(const PoolOptions& options, const RankIdentity& id, int status) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  wire::RankExit* exit = e.mutable_rank_exit();
  wire::RankInfo* info = exit->mutable_rank();
  info->set_world(id.world);
  info->set_rank(id.rank);
  info->set_world_size(id.world_size);
  info->set_host(id.host);
  info->set_device(id.device);
  info->set_pid(id.pid);
  exit->set_rank_token(id.rank_token);
  if (WIFSIGNALED(status)) {
    exit->set_signal(WTERMSIG(status));
    exit->set_forwarded(WTERMSIG(status) == g_forwarded);
  } else {
    exit->set_exit_code(WEXITSTATUS(status));
  }
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  if (!options.insecure) MakeCurveClient(socket, options.keys);
  socket.connect(options.endpoint);
  socket.send(zmq::buffer(e.SerializeAsString()), zmq::send_flags::dontwait);
  zmq::pollitem_t items[] = {{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0}};
  for (int i = 0; i < 20 && !(items[0].revents & ZMQ_POLLIN); ++i) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t&) {  // EINTR from a forwarded signal
    }
  }
}

[[noreturn]] void Supervise(pid_t child, int read_fd, const PoolOptions& options) {
  g_child = child;
  struct sigaction action {};
  action.sa_handler = Forward;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT}) sigaction(signal, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  const RankIdentity id = ReadIdentity(read_fd);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!clean && !id.world.empty()) ReportExit(options, id, status);
  // An mpirun that only launched agents would take a non-zero status for a failed world
  // and stop every other agent with it: the death is the coordinator's to hear, above.
  // Started any other way, the status is passed on.
  if (options.under_mpirun) std::_Exit(0);
  std::_Exit(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status));
}

}  // namespace

int ForkRankSupervisor(const PoolOptions& options) {
  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("worker: pipe");
    std::exit(1);
  }
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("worker: fork");
    std::exit(1);
  }
  if (child > 0) {
    ::close(fds[1]);
    Supervise(child, fds[0], options);
  }
  ::close(fds[0]);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) std::_Exit(1);  // the supervisor died before prctl took effect
  return fds[1];
}

void TellSupervisor(int fd, const RankIdentity& self) {
  if (fd < 0) return;
  const std::string line = self.world + "\t" + std::to_string(self.rank) + "\t" + std::to_string(self.world_size) +
                           "\t" + self.host + "\t" + self.device + "\t" + std::to_string(self.pid) + "\t" +
                           self.rank_token + "\n";
  ssize_t unused = ::write(fd, line.data(), line.size());
  (void)unused;
  ::close(fd);
}

}  // namespace trainyard
