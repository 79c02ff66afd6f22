#include "worker/serve/grpc_gate.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/log.h"

namespace trainyard {
namespace {

// How long accepting pauses when the process is out of descriptors, so that the
// listener is not polled in a busy loop while the connections that hold them go.
constexpr auto kOutOfDescriptorsPause = std::chrono::milliseconds(100);
// Closed connections are noticed at least this often, whether or not any arrives.
constexpr int kSweepMs = 1000;

int ListeningSocket(const std::string& host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    throw std::runtime_error("cannot listen for gRPC on " + where + ": " + ::gai_strerror(rc));
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int on = 1;
  const bool ok = fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
                  ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0;
  const int error = errno;
  ::freeaddrinfo(found);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot listen for gRPC on " + where + ": " + std::strerror(error));
  }
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *bound_port = ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                                                    : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  return fd;
}

// The kernel's view of a held connection; false if the descriptor is no socket.
bool TcpInfoOf(int fd, tcp_info* info) {
  socklen_t length = sizeof *info;
  return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &length) == 0;
}

}  // namespace

GrpcConnectionGate::GrpcConnectionGate(grpc::Server* server, const GrpcGateOptions& options)
    : server_(server), options_(options) {
  listen_fd_ = ListeningSocket(options.host == "localhost" ? "127.0.0.1" : options.host, options.port, &port_);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    throw std::runtime_error(std::string("gRPC listener: cannot make a pipe: ") + std::strerror(errno));
  }
  wake_read_ = pipe_fds[0];
  wake_write_ = pipe_fds[1];
}

GrpcConnectionGate::~GrpcConnectionGate() {
  Stop();
  for (int fd : {listen_fd_, wake_read_, wake_write_})
    if (fd >= 0) ::close(fd);
}

void GrpcConnectionGate::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void GrpcConnectionGate::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!::write(wake_write_, &byte, 1);
    thread_.join();
  }
  for (const Held& held : held_) ::close(held.watch_fd);
  held_.clear();
}

void GrpcConnectionGate::Loop() {
  while (true) {
    const bool paused = std::chrono::steady_clock::now() < accept_paused_until_;
    pollfd fds[2] = {{wake_read_, POLLIN, 0}, {listen_fd_, static_cast<short>(paused ? 0 : POLLIN), 0}};
    const int ready = ::poll(fds, 2, paused ? int(kOutOfDescriptorsPause.count()) : kSweepMs);
    if (ready > 0 && (fds[0].revents & POLLIN)) return;
    ForgetClosed();
    if (ready > 0 && (fds[1].revents & POLLIN)) AcceptAll();
  }
}

void GrpcConnectionGate::AcceptAll() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(fd);
      continue;
    }
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      const auto now = std::chrono::steady_clock::now();
      accept_paused_until_ = now + kOutOfDescriptorsPause;
      if (now - last_warned_ < std::chrono::seconds(10)) return;
      last_warned_ = now;
      LogWarn("serve: out of descriptors accepting a gRPC connection (" + std::string(std::strerror(errno)) +
              "); accepting pauses " + std::to_string(kOutOfDescriptorsPause.count()) + " ms");
    }
    return;  // EAGAIN: none left; anything else: the client went away first
  }
}

void GrpcConnectionGate::Admit(int fd) {
  if (held_.size() >= options_.max_connections && !EvictQuietest()) {
    ::close(fd);  // every held connection is in use: this one is told by its closing
    ++refused_;
    return;
  }
  const int watch = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (watch < 0) {
    ::close(fd);
    ++refused_;
    return;
  }
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  held_.push_back({watch});
  grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns `fd` from here on
}

void GrpcConnectionGate::ForgetClosed() {
  auto closed = std::remove_if(held_.begin(), held_.end(), [](const Held& held) {
    tcp_info info{};
    if (TcpInfoOf(held.watch_fd, &info) && info.tcpi_state == TCP_ESTABLISHED) return false;
    ::close(held.watch_fd);
    return true;
  });
  held_.erase(closed, held_.end());
}

bool GrpcConnectionGate::EvictQuietest() {
  ForgetClosed();
  if (held_.size() < options_.max_connections) return true;
  auto quietest = held_.end();
  uint32_t longest_ms = 0;
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    tcp_info info{};
    if (TcpInfoOf(it->watch_fd, &info) && info.tcpi_last_data_recv >= longest_ms) {
      longest_ms = info.tcpi_last_data_recv;
      quietest = it;
    }
  }
  if (quietest == held_.end() || longest_ms < uint32_t(options_.min_idle_s * 1000)) return false;
  ::shutdown(quietest->watch_fd, SHUT_RDWR);  // gRPC sees the end and closes its own descriptor
  ::close(quietest->watch_fd);
  held_.erase(quietest);
  ++evicted_;
  return true;
}

}  // namespace trainyard
