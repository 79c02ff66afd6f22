#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "common/clock.h"

extern char** environ;

namespace trainyard {
namespace {

// This process's environment with `extra` added or replacing, as "KEY=VALUE" strings.
std::vector<std::string> Environment(const std::vector<std::pair<std::string, std::string>>& extra) {
  std::map<std::string, std::string> values;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const size_t eq = text.find('=');
    if (eq != std::string::npos) values[text.substr(0, eq)] = text.substr(eq + 1);
  }
  for (const auto& [key, value] : extra) values[key] = value;
  std::vector<std::string> out;
  out.reserve(values.size());
  for (const auto& [key, value] : values) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Reads what is there on `fd` into `into` (up to `cap`; the rest is dropped); false at EOF.
bool Drain(int fd, std::string* into, size_t cap) {
  char buffer[4096];
  const ssize_t n = ::read(fd, buffer, sizeof buffer);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  const size_t room = cap > into->size() ? cap - into->size() : 0;
  into->append(buffer, std::min(room, static_cast<size_t>(n)));
  return true;
}

void Record(int status, CommandResult* result) {
  if (WIFEXITED(status)) result->exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result->signal = WTERMSIG(status);
}

}  // namespace

std::string CommandResult::Describe() const {
  if (!started) return "could not start: " + error;
  if (timed_out) return "timed out" + (error.empty() ? "" : ": " + error);
  std::string text = signal ? "killed by signal " + std::to_string(signal) : "exit " + std::to_string(exit_code);
  const std::string& said = err.find_first_not_of(" \n") != std::string::npos ? err : out;
  const size_t begin = said.find_first_not_of(" \n");
  if (begin != std::string::npos) text += ": " + said.substr(begin, said.find('\n', begin) - begin);
  return text;
}

CommandResult RunCommand(const std::vector<std::string>& argv, const CommandOptions& options) {
  CommandResult result;
  if (argv.empty()) {
    result.error = "no command";
    return result;
  }
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    result.error = std::strerror(errno);
    return result;
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.error = std::strerror(errno);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t defaults, none;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);  // a caller that ignores SIGPIPE would pass that on
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  std::vector<std::string> args = argv, env = Environment(options.env);
  std::vector<char*> arg_pointers = Pointers(args), env_pointers = Pointers(env);
  pid_t pid = 0;
  const int spawned =
      ::posix_spawnp(&pid, args[0].c_str(), &actions, &attributes, arg_pointers.data(), env_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (spawned != 0) {
    result.error = argv[0] + ": " + std::strerror(spawned);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return result;
  }
  result.started = true;
  const Clock::time_point started = Clock::now();
  auto left_ms = [&] { return static_cast<int>(std::max(0.0, (options.timeout_s - SecondsSince(started)) * 1000)); };
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open = 2;
  while (open > 0 && left_ms() > 0) {
    if (::poll(fds, 2, std::min(left_ms(), 100)) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (!Drain(fds[i].fd, i == 0 ? &result.out : &result.err, options.max_output_bytes)) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && left_ms() > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (done != pid) {
    result.timed_out = true;
    result.error = "after " + std::to_string(static_cast<int>(options.timeout_s)) + " s";
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  Record(status, &result);
  for (const pollfd& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  return result;
}

}  // namespace trainyard
