#include "worker/elastic/tcp_ring.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <utility>

#include "common/clock.h"

namespace trainyard {
namespace {

constexpr std::array<char, 8> kMagic = {'T', 'Y', 'R', 'I', 'N', 'G', '1', '\0'};
constexpr size_t kNonceBytes = 16;
constexpr size_t kHelloBytes = 16;  // epoch (8), size (4), position (4), little-endian
constexpr size_t kMacBytes = crypto_auth_hmacsha256_BYTES;

// A connection that failed: the ring turns it into a RingFailure naming the neighbour.
struct ConnectionError {
  int fd;
  std::string what;
};

std::string Errno(const std::string& call) { return call + ": " + std::strerror(errno); }

// Milliseconds to wait in poll before `deadline` (steady seconds); 0 once it has passed.
int PollMs(double deadline) {
  const double left = deadline - SteadySeconds();
  return left <= 0 ? 0 : static_cast<int>(std::ceil(left * 1000));
}

// Waits until `fd` is ready for `events` or `deadline` passes (false).
bool WaitFor(int fd, short events, double deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, PollMs(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) throw ConnectionError{fd, Errno("poll")};
  }
}

void SendAll(int fd, const void* data, size_t size, double deadline) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t sent = ::send(fd, bytes, size, MSG_NOSIGNAL);
    if (sent > 0) {
      bytes += sent;
      size -= static_cast<size_t>(sent);
    } else if (sent < 0 && errno != EAGAIN && errno != EINTR) {
      throw ConnectionError{fd, Errno("send")};
    } else if (!WaitFor(fd, POLLOUT, deadline)) {
      throw ConnectionError{fd, "took no data before the deadline"};
    }
  }
}

void ReceiveAll(int fd, void* data, size_t size, double deadline) {
  auto* bytes = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t got = ::recv(fd, bytes, size, 0);
    if (got > 0) {
      bytes += got;
      size -= static_cast<size_t>(got);
    } else if (got == 0) {
      throw ConnectionError{fd, "closed the connection"};
    } else if (errno != EAGAIN && errno != EINTR) {
      throw ConnectionError{fd, Errno("recv")};
    } else if (!WaitFor(fd, POLLIN, deadline)) {
      throw ConnectionError{fd, "sent nothing before the deadline"};
    }
  }
}

// Note [The replica ring]: the kernel fails a connection whose sent data stays
// unacknowledged for the timeout, and probes an idle one every second.
void SetConnectionOptions(int fd, double timeout_s) {
  const int on = 1, idle = 1, interval = 1, probes = 3;
  const unsigned user_timeout_ms = static_cast<unsigned>(std::max(1.0, timeout_s * 1000));
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

void PutLe(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

std::array<uint8_t, kMacBytes> Mac(const std::string& secret, const uint8_t* nonce, const uint8_t* hello) {
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  crypto_auth_hmacsha256_update(&state, nonce, kNonceBytes);
  crypto_auth_hmacsha256_update(&state, hello, kHelloBytes);
  std::array<uint8_t, kMacBytes> mac{};
  crypto_auth_hmacsha256_final(&state, mac.data());
  return mac;
}

// What one end of a connection expects of the other.
struct Expected {
  uint64_t epoch;
  uint32_t size, own_position, peer_position;
};

// The handshake of Note [The replica ring] on `fd`. "" if the peer proved the secret
// and is the member expected; otherwise why not. Throws ConnectionError if the
// connection fails first.
std::string Handshake(int fd, const std::string& secret, const Expected& expected, double deadline) {
  std::array<uint8_t, kMagic.size() + kNonceBytes> mine{}, theirs{};
  std::memcpy(mine.data(), kMagic.data(), kMagic.size());
  randombytes_buf(mine.data() + kMagic.size(), kNonceBytes);
  SendAll(fd, mine.data(), mine.size(), deadline);
  ReceiveAll(fd, theirs.data(), theirs.size(), deadline);
  if (std::memcmp(theirs.data(), kMagic.data(), kMagic.size()) != 0) return "not a ring member (no magic)";
  std::array<uint8_t, kHelloBytes + kMacBytes> hello{}, answer{};
  PutLe(hello.data(), expected.epoch, 8);
  PutLe(hello.data() + 8, expected.size, 4);
  PutLe(hello.data() + 12, expected.own_position, 4);
  const auto mac = Mac(secret, theirs.data() + kMagic.size(), hello.data());
  std::memcpy(hello.data() + kHelloBytes, mac.data(), kMacBytes);
  SendAll(fd, hello.data(), hello.size(), deadline);
  ReceiveAll(fd, answer.data(), answer.size(), deadline);
  const auto proof = Mac(secret, mine.data() + kMagic.size(), answer.data());
  if (sodium_memcmp(proof.data(), answer.data() + kHelloBytes, kMacBytes) != 0) return "its proof of the secret failed";
  const uint64_t epoch = GetLe(answer.data(), 8);
  const uint64_t size = GetLe(answer.data() + 8, 4), position = GetLe(answer.data() + 12, 4);
  if (epoch != expected.epoch)
    return "it is of membership " + std::to_string(epoch) + ", not " + std::to_string(expected.epoch);
  if (size != expected.size || position != expected.peer_position)
    return "it is member " + std::to_string(position) + " of " + std::to_string(size) + ", not " +
           std::to_string(expected.peer_position) + " of " + std::to_string(expected.size);
  return "";
}

// A non-blocking TCP connection to `member`, retried while it refuses (its listener is
// not up yet) until `deadline`; -1 if none was made.
int Connect(const RingMember& member, double deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(member.port);
  if (const int rc = ::getaddrinfo(member.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    *why = std::string("cannot resolve its host: ") + ::gai_strerror(rc);
    return -1;
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  do {
    const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(Errno("socket"));
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0 ||
        (errno == EINPROGRESS && WaitFor(fd, POLLOUT, deadline))) {
      int error = 0;
      socklen_t length = sizeof error;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error == 0) return fd;
      errno = error;
    }
    *why = Errno("connect");
    ::close(fd);
    if (errno != ECONNREFUSED) return -1;
    ::usleep(20000);
  } while (SteadySeconds() < deadline);
  return -1;
}

}  // namespace

RingListener::RingListener(const std::string& host, int port) {
  if (sodium_init() < 0) throw std::runtime_error("libsodium did not initialise");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1)
    throw std::invalid_argument("a ring listens on an IPv4 address, not '" + host + "'");
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(Errno("socket"));
  const int on = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  socklen_t length = sizeof address;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(fd_, 16) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string why = Errno("bind/listen on " + host + ":" + std::to_string(port));
    ::close(fd_);
    throw std::runtime_error(why);
  }
  port_ = ntohs(address.sin_port);
}

RingListener::~RingListener() { ::close(fd_); }

TcpRing::TcpRing(RingListener& listener, std::vector<RingMember> members, int position, uint64_t epoch,
                 RingOptions options)
    : members_(std::move(members)), position_(position), epoch_(epoch), options_(std::move(options)) {
  if (position_ < 0 || position_ >= size())
    throw std::invalid_argument("ring position " + std::to_string(position_) + " is not one of " +
                                std::to_string(size()) + " members");
  if (options_.secret.empty()) throw std::invalid_argument("a ring needs the job's secret");
  Form(listener);
}

TcpRing::~TcpRing() {
  if (next_fd_ >= 0) ::close(next_fd_);
  if (previous_fd_ >= 0) ::close(previous_fd_);
}

void TcpRing::Form(RingListener& listener) {
  if (size() == 1) return;
  const double deadline = SteadySeconds() + options_.timeout_s;
  const auto n = static_cast<uint32_t>(size());
  // The connection to the next member is made beside the accept: each member's accept
  // waits for its previous one's connection, so doing one after the other would wait
  // round the whole ring.
  std::string next_failure;
  std::thread connector([&] {
    int fd = Connect(members_[Next()], deadline, &next_failure);
    if (fd < 0) return;
    try {
      SetConnectionOptions(fd, options_.timeout_s);
      next_failure = Handshake(fd, options_.secret, {epoch_, n, uint32_t(position_), uint32_t(Next())}, deadline);
    } catch (const ConnectionError& e) {
      next_failure = e.what;
    }
    if (next_failure.empty())
      next_fd_ = fd;
    else
      ::close(fd);
  });
  std::string previous_failure = "did not connect";
  while (previous_fd_ < 0 && WaitFor(listener.fd(), POLLIN, deadline)) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    SetConnectionOptions(fd, options_.timeout_s);
    try {
      previous_failure =
          Handshake(fd, options_.secret, {epoch_, n, uint32_t(position_), uint32_t(Previous())}, deadline);
    } catch (const ConnectionError& e) {
      previous_failure = e.what;
    }
    if (previous_failure.empty()) {
      previous_fd_ = fd;
    } else {
      ::close(fd);
      ++refused_;
    }
  }
  connector.join();
  const auto who = [&](int member) {
    return "ring member " + std::to_string(member) + " (" + members_[member].host + ":" +
           std::to_string(members_[member].port) + ", membership " + std::to_string(epoch_) + ")";
  };
  if (next_fd_ < 0) throw RingFailure(Next(), who(Next()) + ": " + next_failure);
  if (previous_fd_ < 0)
    throw RingFailure(Previous(), who(Previous()) + " joined no ring within " + std::to_string(options_.timeout_s) +
                                      " s (the last refusal: " + previous_failure + ")");
}

void TcpRing::Fail(int fd, const std::string& what) const {
  const int member = fd == next_fd_ ? Next() : Previous();
  throw RingFailure(member, "ring member " + std::to_string(member) + " (" + members_[member].host + ":" +
                                std::to_string(members_[member].port) + ", membership " + std::to_string(epoch_) +
                                ") " + what);
}

void TcpRing::Exchange(const void* send, size_t send_size, void* receive, size_t receive_size, double deadline) {
  const auto* out = static_cast<const uint8_t*>(send);
  auto* in = static_cast<uint8_t*>(receive);
  while (send_size > 0 || receive_size > 0) {
    std::array<pollfd, 2> waits{pollfd{next_fd_, short(send_size > 0 ? POLLOUT : 0), 0},
                                pollfd{previous_fd_, short(receive_size > 0 ? POLLIN : 0), 0}};
    const int ready = ::poll(waits.data(), waits.size(), PollMs(deadline));
    if (ready == 0)
      Fail(receive_size > 0 ? previous_fd_ : next_fd_,
           receive_size > 0 ? "sent nothing before the deadline" : "took no data before the deadline");
    if (ready < 0) {
      if (errno == EINTR) continue;
      Fail(next_fd_, Errno("poll"));
    }
    if (send_size > 0 && waits[0].revents != 0) {
      const ssize_t sent = ::send(next_fd_, out, send_size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && errno != EAGAIN && errno != EINTR) Fail(next_fd_, Errno("send"));
      if (sent > 0) {
        out += sent;
        send_size -= static_cast<size_t>(sent);
      }
    }
    if (receive_size > 0 && waits[1].revents != 0) {
      const ssize_t got = ::recv(previous_fd_, in, receive_size, MSG_DONTWAIT);
      if (got == 0) Fail(previous_fd_, "closed the connection");
      if (got < 0 && errno != EAGAIN && errno != EINTR) Fail(previous_fd_, Errno("recv"));
      if (got > 0) {
        in += got;
        receive_size -= static_cast<size_t>(got);
      }
    }
  }
}

void TcpRing::AllReduceSum(float* data, size_t count) {
  const int n = size();
  if (n == 1 || count == 0) return;
  const double deadline = SteadySeconds() + options_.timeout_s;
  const auto begin = [&](int chunk) { return count * static_cast<size_t>(chunk) / static_cast<size_t>(n); };
  const auto length = [&](int chunk) { return begin(chunk + 1) - begin(chunk); };
  std::vector<float> incoming((count + n - 1) / n + 1);  // the longest chunk
  for (int step = 0; step < n - 1; ++step) {             // reduce-scatter
    const int out = (position_ - step + n) % n, in = (position_ - step - 1 + n) % n;
    Exchange(data + begin(out), length(out) * sizeof(float), incoming.data(), length(in) * sizeof(float), deadline);
    float* total = data + begin(in);
    for (size_t i = 0; i < length(in); ++i) total[i] += incoming[i];
  }
  for (int step = 0; step < n - 1; ++step) {  // all-gather of the totals
    const int out = (position_ + 1 - step + n) % n, in = (position_ - step + n) % n;
    Exchange(data + begin(out), length(out) * sizeof(float), data + begin(in), length(in) * sizeof(float), deadline);
  }
}

void TcpRing::Broadcast(void* bytes, size_t size_bytes, int root) {
  if (size() == 1 || size_bytes == 0) return;
  const double deadline = SteadySeconds() + options_.timeout_s;
  try {
    if (position_ != root) ReceiveAll(previous_fd_, bytes, size_bytes, deadline);
    if (Next() != root) SendAll(next_fd_, bytes, size_bytes, deadline);
  } catch (const ConnectionError& e) {
    Fail(e.fd, e.what);
  }
}

}  // namespace trainyard
