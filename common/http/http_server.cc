#include "common/http/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>

#include "common/log.h"

namespace trainyard {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct HttpServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
};

namespace {

bool PeerHungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// After answering a request whose body we refused to read: stop sending, and read and
// drop what the client is still sending (up to a few seconds) before closing, so that it
// sees the answer instead of a reset connection.
void LingeringClose(int fd) {
  ::shutdown(fd, SHUT_WR);
  char sink[65536];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (::recv(fd, sink, sizeof sink, 0) <= 0) return;
  }
}

HttpResponse Plain(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = "{\"error\":\"" + message + "\"}";
  return r;
}

std::string FormatSeconds(double seconds) {
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text;
}

// A claim on the server-wide budget of request-body bytes, released when it goes.
class BodyBudget {
 public:
  BodyBudget(std::atomic<size_t>* used, size_t bytes, size_t cap) : used_(used), bytes_(bytes) {
    size_t now = used_->load();
    do {
      if (now + bytes_ > cap && bytes_ > 0) return;
    } while (!used_->compare_exchange_weak(now, now + bytes_));
    granted_ = true;
  }
  ~BodyBudget() {
    if (granted_) used_->fetch_sub(bytes_);
  }
  BodyBudget(const BodyBudget&) = delete;
  BodyBudget& operator=(const BodyBudget&) = delete;
  bool granted() const { return granted_; }

 private:
  std::atomic<size_t>* used_;
  size_t bytes_;
  bool granted_ = false;
};

// Waits until fd is ready for `events` or has hung up or failed (true), or until
// `deadline` passes (false).
bool WaitReady(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready != 0 && !(ready < 0 && errno == EINTR)) return true;  // ready, hang-up or error: the call says
  }
}

// The connection's socket as Beast's SyncReadStream, with a deadline: each read first
// waits for data no later than `deadline`, then fails with timed_out. Beast's sync
// read_header/read loop on read_some, so the deadline bounds the whole request, however
// slowly its bytes come.
class DeadlineReader {
 public:
  explicit DeadlineReader(tcp::socket* socket) : socket_(socket) {}
  void set_deadline(std::chrono::steady_clock::time_point deadline) { deadline_ = deadline; }

  template <typename Buffers>
  size_t read_some(const Buffers& buffers, beast::error_code& error) {
    if (!WaitReady(socket_->native_handle(), POLLIN, deadline_)) {
      error = asio::error::timed_out;
      return 0;
    }
    return socket_->read_some(buffers, error);
  }
  template <typename Buffers>
  size_t read_some(const Buffers& buffers) {
    beast::error_code error;
    const size_t n = read_some(buffers, error);
    if (error) throw beast::system_error(error);
    return n;
  }

 private:
  tcp::socket* socket_;
  std::chrono::steady_clock::time_point deadline_;
};

// The connection's socket as Beast's SyncWriteStream, with a stall limit: each write
// waits at most `stall` for room in the socket's buffer and then sends what fits without
// blocking, so a client that stops reading its responses cannot hold a connection thread
// for longer, while one that reads slowly but steadily gets its whole response. (A
// blocking send would wait forever; SO_SNDTIMEO does not help, since Asio's sync send
// polls again on EAGAIN.)
class DeadlineWriter {
 public:
  DeadlineWriter(int fd, std::chrono::steady_clock::duration stall) : fd_(fd), stall_(stall) {}

  // All of `buffers` in one sendmsg, as Asio's own write_some does: a header and a body
  // sent apart would meet Nagle's algorithm and the client's delayed ACK (40 ms).
  template <typename Buffers>
  size_t write_some(const Buffers& buffers, beast::error_code& error) {
    error = {};
    std::array<iovec, 64> parts{};
    size_t count = 0, bytes = 0;
    for (auto it = asio::buffer_sequence_begin(buffers);
         it != asio::buffer_sequence_end(buffers) && count < parts.size(); ++it) {
      const asio::const_buffer buffer(*it);
      if (buffer.size() == 0) continue;
      parts[count++] = {const_cast<void*>(buffer.data()), buffer.size()};
      bytes += buffer.size();
    }
    if (bytes == 0) return 0;
    msghdr message{};
    message.msg_iov = parts.data();
    message.msg_iovlen = count;
    const auto deadline = std::chrono::steady_clock::now() + stall_;
    for (;;) {
      if (!WaitReady(fd_, POLLOUT, deadline)) {
        error = asio::error::timed_out;
        return 0;
      }
      const ssize_t sent = ::sendmsg(fd_, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent >= 0) return size_t(sent);
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        error = beast::error_code(errno, beast::system_category());
        return 0;
      }
    }
  }
  template <typename Buffers>
  size_t write_some(const Buffers& buffers) {
    beast::error_code error;
    const size_t n = write_some(buffers, error);
    if (error) throw beast::system_error(error);
    return n;
  }

 private:
  int fd_;
  std::chrono::steady_clock::duration stall_;
};

}  // namespace

HttpResponse HttpServer::Dispatch(const http::request<http::string_body>& message,
                                  const std::function<bool()>& client_gone, bool* keep_alive) {
  HttpRequest request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  request.body = message.body();
  for (const auto& field : message) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    request.headers[name] = std::string(field.value());
  }
  *keep_alive = message.keep_alive();
  try {
    return handler_(request, client_gone);
  } catch (const std::exception& e) {
    LogError(log_name_ + ": http handler: " + e.what());
    return Plain(500, "internal error");
  }
}

HttpServer::HttpServer(const HttpServerOptions& options, Handler handler)
    : impl_(std::make_unique<Impl>()),
      max_body_bytes_(options.max_body_bytes),
      max_buffered_bytes_(std::max(kMinBufferedBytes, 4 * options.max_body_bytes)),
      max_connections_(options.max_connections),
      body_limit_setting_(options.body_limit_setting),
      log_name_(options.log_name),
      idle_timeout_s_(options.idle_timeout_s),
      request_timeout_s_(options.request_timeout_s),
      handler_(std::move(handler)) {
  const std::string& host = options.host;
  const int port = options.port;
  beast::error_code error;
  const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, error);
  if (error) throw std::runtime_error(host + ": not an IP address");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  impl_->acceptor.open(endpoint.protocol(), error);
  if (!error) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) impl_->acceptor.bind(endpoint, error);
  if (!error) impl_->acceptor.listen(asio::socket_base::max_listen_connections, error);
  if (error) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + error.message());
  port_ = impl_->acceptor.local_endpoint().port();
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Start() {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

void HttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  // Connection threads are detached; each leaves under mutex_ as its last step.
  for (int i = 0; i < 5000 && active_.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::lock_guard<std::mutex> lock(mutex_);
}

void HttpServer::AcceptLoop() {
  while (!stopping_) {
    tcp::socket socket(impl_->io);
    beast::error_code error;
    impl_->acceptor.accept(socket, error);
    if (error) {
      if (stopping_) return;
      continue;
    }
    if (active_.load() >= max_connections_) continue;  // closed as `socket` goes
    const int fd = socket.release(error);
    std::lock_guard<std::mutex> lock(mutex_);
    open_fds_.insert(fd);
    ++active_;
    std::thread([this, fd] { Serve(fd); }).detach();
  }
}

bool HttpServer::AwaitRequest(int fd) const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(idle_timeout_s_);
  while (!stopping_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
    if (ready > 0) return true;  // data, or the peer closed: the read says which
    if (ready < 0 && errno != EINTR) return true;
  }
  return false;
}

void HttpServer::Serve(int fd) {
  asio::io_context io;
  tcp::socket socket(io);
  beast::error_code error;
  socket.assign(tcp::v4(), fd, error);
  beast::flat_buffer buffer;
  DeadlineReader reader(&socket);
  const auto request_timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(request_timeout_s_));
  DeadlineWriter writer(fd, request_timeout);
  const std::function<bool()> client_gone = [fd] { return PeerHungUp(fd); };
  while (!stopping_ && !error) {
    if (buffer.size() == 0 && !AwaitRequest(fd)) break;  // bytes already buffered: a pipelined request
    http::request_parser<http::string_body> parser;
    parser.body_limit(max_body_bytes_);
    parser.header_limit(64 * 1024);
    reader.set_deadline(std::chrono::steady_clock::now() + request_timeout);
    http::read_header(reader, buffer, parser, error);
    if (error == http::error::end_of_stream || error == asio::error::eof || error == asio::error::connection_reset)
      break;
    // The body's bytes count against the server-wide budget before they are read.
    const size_t claimed =
        parser.content_length() ? size_t(*parser.content_length()) : (parser.chunked() ? max_body_bytes_ : 0);
    BodyBudget budget(&buffered_bytes_, std::min(claimed, max_body_bytes_ + 1), max_buffered_bytes_);
    HttpResponse response;
    bool keep_alive = false, drain = false;
    if (!error && claimed > max_body_bytes_) error = http::error::body_limit;
    if (!error && !budget.granted()) {
      response = Plain(429, "server busy: request bodies in flight fill the server's " +
                                std::to_string(max_buffered_bytes_ >> 20) + " MiB budget; retry");
      drain = true;
    } else {
      if (!error) http::read(reader, buffer, parser, error);
      if (error == asio::error::timed_out) {  // headers or body; the rest is never read
        response = Plain(408, "request not received whole within " + FormatSeconds(request_timeout_s_) + " s");
        drain = true;
      } else if (error == http::error::body_limit) {
        response = Plain(400, "request body: larger than " +
                                  (body_limit_setting_.empty() ? "the limit" : body_limit_setting_) + " (" +
                                  std::to_string(max_body_bytes_ >> 20) + " MiB)");
        drain = true;
      } else if (error) {
        response = Plain(400, "malformed HTTP request: " + error.message());
      } else {
        response = Dispatch(parser.get(), client_gone, &keep_alive);
      }
    }
    if (response.status == 499) break;  // the client went away: nobody to answer
    http::response<http::string_body> out{static_cast<http::status>(response.status), 11};
    out.set(http::field::server, "trainyard");
    out.set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) out.set(name, value);
    out.keep_alive(keep_alive);
    out.body() = std::move(response.body);
    out.prepare_payload();
    beast::error_code write_error;
    http::write(writer, out, write_error);
    if (write_error == asio::error::timed_out)
      LogWarn(log_name_ + ": a client took none of its response for " + FormatSeconds(request_timeout_s_) +
              " s; its connection is closed");
    if (!write_error && drain) LingeringClose(fd);
    if (write_error || !keep_alive) break;
    error = {};
  }
  socket.shutdown(tcp::socket::shutdown_both, error);
  socket.close(error);
  std::lock_guard<std::mutex> lock(mutex_);
  open_fds_.erase(fd);
  --active_;
}

}  // namespace trainyard
