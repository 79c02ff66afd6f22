#include "common/http/http_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include "common/http/http_framing.h"
#include "common/log.h"
#include "common/open_file_limit.h"

namespace trainyard {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

constexpr size_t kMinBufferedBytes = size_t(64) << 20;
constexpr size_t kHeaderLimitBytes = size_t(64) * 1024;
constexpr auto kLingerTime = std::chrono::seconds(3);
constexpr char kRetryAfterSeconds[] = "1";

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string FormatSeconds(double seconds) {
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text;
}

HttpResponse Plain(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = "{\"error\":\"" + message + "\"}";
  return r;
}

HttpResponse Busy(const std::string& message) {
  HttpResponse r = Plain(503, message);
  r.headers.emplace_back("Retry-After", kRetryAfterSeconds);
  return r;
}

bool PeerHungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
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

// Threads for handlers, started as work comes, up to `max_threads`; at most
// `max_waiting` tasks wait for one.
class HandlerPool {
 public:
  HandlerPool(size_t max_threads, size_t max_waiting)
      : max_threads_(std::max<size_t>(1, max_threads)), max_waiting_(max_waiting) {}
  ~HandlerPool() { Stop(); }

  // False when the waiting line is full.
  bool TryPost(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || waiting_.size() >= max_waiting_) return false;
    waiting_.push_back(std::move(task));
    if (idle_ == 0 && threads_.size() < max_threads_) threads_.emplace_back([this] { Work(); });
    ready_.notify_one();
    return true;
  }

  // Running tasks finish; waiting ones are dropped.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      waiting_.clear();
    }
    ready_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++idle_;
      ready_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
      --idle_;
      if (stopping_) return;
      std::function<void()> task = std::move(waiting_.front());
      waiting_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // what it holds goes before the lock is taken again
      lock.lock();
    }
  }

  const size_t max_threads_, max_waiting_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> waiting_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

struct HttpServer::Impl {
  class Session;

  Impl(const HttpServerOptions& o, Handler h)
      : options(o),
        handler(std::move(h)),
        max_buffered_bytes(std::max(kMinBufferedBytes, 4 * o.max_body_bytes)),
        per_peer(o.max_connections_per_peer ? o.max_connections_per_peer : o.max_connections),
        pool(o.handler_threads, o.max_waiting_requests) {}

  void Accept();
  void Admit(tcp::socket socket);
  // Closes the connection that has waited longest without a request in hand (of `peer`,
  // if not empty); false if there is none. On the io thread.
  bool EvictOne(const std::string& peer);
  void Unregister(Session* session);
  HttpResponse Dispatch(const http::request<http::string_body>& message, const std::function<bool()>& client_gone,
                        bool* keep_alive);

  const HttpServerOptions options;
  const Handler handler;
  const size_t max_buffered_bytes, per_peer;
  std::atomic<size_t> buffered_bytes{0};
  std::atomic<bool> stopping{false};

  // The registry outlives io_context (declared first): sessions destroyed with the
  // context's pending handlers unregister themselves.
  std::mutex mutex;
  std::list<Session*> sessions;
  std::map<std::string, size_t> per_peer_count;

  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_pause{io};
  std::thread io_thread;
  HandlerPool pool;
};

// One connection. Its callbacks run on the io thread; the handler runs on the pool, and
// its response comes back to the io thread to be written.
//
// Deadlines are a timer of the session's own: when one passes, the pending read or write
// is cancelled (the socket stays open), so that a request that came too slowly can still
// be answered 408.
class HttpServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  enum class State { kWaiting, kReading, kHandling, kWriting };

  Session(Impl* server, tcp::socket socket, std::string peer)
      : server_(server),
        socket_(std::move(socket)),
        timer_(server->io),
        peer_(std::move(peer)),
        fd_(socket_.native_handle()) {}
  ~Session() { server_->Unregister(this); }

  void Begin() { AwaitRequest(); }
  const std::string& peer() const { return peer_; }
  // Waiting for a request, or reading one in, since when: what eviction looks at.
  bool Evictable() const { return state_ == State::kWaiting || state_ == State::kReading; }
  SteadyClock::time_point since() const { return since_; }
  void Close() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    if (state_ != State::kHandling) socket_.close(ignored);  // the handler polls the fd
  }

 private:
  void Enter(State state) {
    state_ = state;
    since_ = SteadyClock::now();
  }

  // From now until Disarm() or the next Arm(), the pending operation ends at `after`.
  void Arm(SteadyClock::duration after) {
    timed_out_ = false;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this()](beast::error_code error) {
      if (error) return;  // cancelled: re-armed or disarmed
      self->timed_out_ = true;
      beast::error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void Disarm() { timer_.cancel(); }

  void AwaitRequest() {
    Enter(State::kWaiting);
    if (buffer_.size() > 0) return ReadHeader();  // a pipelined request is already here
    Arm(Seconds(server_->options.idle_timeout_s));
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code error, size_t bytes) {
      if (error) return self->End();
      self->buffer_.commit(bytes);
      self->ReadHeader();
    });
  }

  // The request's deadline runs from its first byte, across headers and body.
  void ReadHeader() {
    Enter(State::kReading);
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(kHeaderLimitBytes);
    Arm(Seconds(server_->options.request_timeout_s));
    http::async_read_header(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code error, size_t) {
      self->HeaderRead(self->timed_out_ ? beast::error::timeout : error);
    });
  }

  void HeaderRead(beast::error_code error) {
    if (error == http::error::end_of_stream || error == asio::error::eof || error == asio::error::connection_reset ||
        error == asio::error::operation_aborted)
      return End();
    // What is left of a request refused for its size or slowness is drained, not reset.
    if (error) return Refuse(ErrorResponse(error), error == beast::error::timeout || error == http::error::body_limit);
    if (auto refusal = FramingRefusal(*parser_)) return Refuse(Plain(refusal->status, refusal->message), true);
    // The body's bytes count against the server-wide budget before they are read.
    const size_t limit = server_->options.max_body_bytes;
    const size_t claimed =
        parser_->content_length() ? size_t(*parser_->content_length()) : (parser_->chunked() ? limit : 0);
    if (claimed > limit) return Refuse(ErrorResponse(http::error::body_limit), true);
    budget_.emplace(&server_->buffered_bytes, std::min(claimed, limit + 1), server_->max_buffered_bytes);
    if (!budget_->granted())
      return Refuse(Plain(429, "server busy: request bodies in flight fill the server's " +
                                   std::to_string(server_->max_buffered_bytes >> 20) + " MiB budget; retry"),
                    true);
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code error, size_t) {
      if (self->timed_out_) error = beast::error::timeout;
      if (error == asio::error::operation_aborted) return self->End();
      if (error) return self->Refuse(self->ErrorResponse(error), error != http::error::end_of_stream);
      self->Handle();
    });
  }

  HttpResponse ErrorResponse(beast::error_code error) const {
    const HttpServerOptions& o = server_->options;
    if (error == beast::error::timeout)
      return Plain(408, "request not received whole within " + FormatSeconds(o.request_timeout_s) + " s");
    if (error == http::error::body_limit)
      return Plain(400, "request body: larger than " +
                            (o.body_limit_setting.empty() ? "the limit" : o.body_limit_setting) + " (" +
                            std::to_string(o.max_body_bytes >> 20) + " MiB)");
    return Plain(400, "malformed HTTP request: " + error.message());
  }

  // The handler, on the pool; its response comes back here to be written.
  void Handle() {
    Disarm();
    Enter(State::kHandling);
    auto self = shared_from_this();
    const int fd = fd_;
    const bool posted = server_->pool.TryPost([self, fd] {
      bool keep_alive = false;
      HttpResponse response = self->server_->Dispatch(
          self->parser_->get(), [fd] { return PeerHungUp(fd); }, &keep_alive);
      asio::post(self->server_->io, [self, response = std::move(response), keep_alive]() mutable {
        self->budget_.reset();
        if (response.status == 499) return self->End();  // the client went away: nobody to answer
        self->Write(std::move(response), keep_alive, false);
      });
    });
    if (!posted) {
      budget_.reset();
      Write(Busy("server busy: every handler is taken and " + std::to_string(server_->options.max_waiting_requests) +
                 " requests wait; retry"),
            false, false);
    }
  }

  // Answers a request whose rest was not read, then lets the client's bytes drain.
  void Refuse(HttpResponse response, bool drain) {
    budget_.reset();
    Write(std::move(response), false, drain);
  }

  void Write(HttpResponse response, bool keep_alive, bool drain) {
    Enter(State::kWriting);
    auto out = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(response.status), 11);
    out->set(http::field::server, "trainyard");
    out->set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) out->set(name, value);
    out->keep_alive(keep_alive);
    out->body() = std::move(response.body);
    out->prepare_payload();
    Arm(Seconds(server_->options.request_timeout_s));
    http::async_write(
        socket_, *out, [self = shared_from_this(), out, keep_alive, drain](beast::error_code error, size_t) {
          if (self->timed_out_)
            LogWarn(self->server_->options.log_name + ": a client took none of its response for " +
                    FormatSeconds(self->server_->options.request_timeout_s) + " s; its connection is closed");
          if (error || self->timed_out_) return self->End();
          if (drain) return self->Linger();
          if (!keep_alive || self->server_->stopping) return self->End();
          self->AwaitRequest();
        });
  }

  // After answering a request whose body was refused: stop sending, and read and drop
  // what the client still sends (for a few seconds) before closing, so that it sees the
  // answer instead of a reset connection.
  void Linger() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    Arm(kLingerTime);
    Discard();
  }

  void Discard() {
    buffer_.consume(buffer_.size());
    socket_.async_read_some(buffer_.prepare(65536), [self = shared_from_this()](beast::error_code error, size_t) {
      if (error) return self->End();
      self->Discard();
    });
  }

  void End() {
    Enter(State::kWriting);  // not evictable: on its way out
    Disarm();
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  Impl* const server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  const std::string peer_;
  const int fd_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<BodyBudget> budget_;
  State state_ = State::kWaiting;
  SteadyClock::time_point since_ = SteadyClock::now();
  bool timed_out_ = false;
};

HttpResponse HttpServer::Impl::Dispatch(const http::request<http::string_body>& message,
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
    return handler(request, client_gone);
  } catch (const std::exception& e) {
    LogError(options.log_name + ": http handler: " + e.what());
    return Plain(500, "internal error");
  }
}

void HttpServer::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code error, tcp::socket socket) {
    if (stopping) return;
    if (error == asio::error::no_descriptors) {  // out of file descriptors: make room, then retry
      EvictOne("");
      accept_pause.expires_after(std::chrono::milliseconds(50));
      accept_pause.async_wait([this](beast::error_code) {
        if (!stopping) Accept();
      });
      return;
    }
    if (!error) Admit(std::move(socket));
    Accept();
  });
}

void HttpServer::Impl::Admit(tcp::socket socket) {
  beast::error_code error;
  const auto remote = socket.remote_endpoint(error);
  if (error) return;  // already gone
  const std::string peer = remote.address().to_string();
  bool full = false, peer_full = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    full = sessions.size() >= options.max_connections;
    const auto count = per_peer_count.find(peer);
    peer_full = count != per_peer_count.end() && count->second >= per_peer;
  }
  if ((peer_full && !EvictOne(peer)) || (full && !peer_full && !EvictOne(""))) {
    // Every connection is busy with a request: this one is told so, without blocking.
    const std::string body = "{\"error\":\"server busy: every connection is in use; retry\"}";
    const std::string busy =
        "HTTP/1.1 503 Service Unavailable\r\nServer: trainyard\r\nRetry-After: " + std::string(kRetryAfterSeconds) +
        "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    (void)::send(socket.native_handle(), busy.data(), busy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    socket.shutdown(tcp::socket::shutdown_both, error);
    return;
  }
  auto session = std::make_shared<Session>(this, std::move(socket), peer);
  {
    std::lock_guard<std::mutex> lock(mutex);
    sessions.push_back(session.get());
    ++per_peer_count[peer];
  }
  session->Begin();
}

bool HttpServer::Impl::EvictOne(const std::string& peer) {
  Session* oldest = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (Session* s : sessions)
      if (s->Evictable() && (peer.empty() || s->peer() == peer) && (!oldest || s->since() < oldest->since()))
        oldest = s;
  }
  if (!oldest) return false;
  oldest->Close();  // its pending read ends with an error, and the session with it
  std::lock_guard<std::mutex> lock(mutex);
  sessions.remove(oldest);  // counted out now: the new connection takes its place
  if (--per_peer_count[oldest->peer()] == 0) per_peer_count.erase(oldest->peer());
  return true;
}

void HttpServer::Impl::Unregister(Session* session) {
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = std::find(sessions.begin(), sessions.end(), session);
  if (it == sessions.end()) return;  // evicted: already counted out
  sessions.erase(it);
  if (--per_peer_count[session->peer()] == 0) per_peer_count.erase(session->peer());
}

HttpServer::HttpServer(const HttpServerOptions& options, Handler handler)
    : impl_(std::make_unique<Impl>(options, std::move(handler))) {
  RaiseOpenFileLimit(options.max_connections + 256);  // a descriptor per connection
  beast::error_code error;
  const std::string& host = options.host;
  const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, error);
  if (error) throw std::runtime_error(host + ": not an IP address");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options.port));
  tcp::acceptor& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), error);
  if (!error) acceptor.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) acceptor.bind(endpoint, error);
  if (!error) acceptor.listen(asio::socket_base::max_listen_connections, error);
  if (error)
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(options.port) + ": " + error.message());
  port_ = acceptor.local_endpoint().port();
}

HttpServer::~HttpServer() {
  try {
    Stop();
  } catch (...) {  // joining a thread can throw; a destructor must not
  }
}

void HttpServer::Start() {
  Impl* impl = impl_.get();
  impl->Accept();
  impl->io_thread = std::thread([impl] {
    auto work = asio::make_work_guard(impl->io);
    impl->io.run();
  });
}

void HttpServer::Stop() {
  Impl* impl = impl_.get();
  if (impl->stopping.exchange(true)) return;
  // On the io thread: no more connections; every one ends (a handling one is only shut
  // down, so that its handler sees the client gone and returns).
  asio::post(impl->io, [impl] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_pause.cancel();
    std::lock_guard<std::mutex> lock(impl->mutex);
    for (Impl::Session* s : impl->sessions) s->Close();
  });
  if (!impl->io_thread.joinable()) impl->io.run_for(std::chrono::seconds(1));  // never started
  impl->pool.Stop();
  impl->io.stop();
  if (impl->io_thread.joinable()) impl->io_thread.join();
}

}  // namespace trainyard
