// A small HTTP/1.1 server on Boost.Beast, shared by serving's front end and the
// coordinator's dashboard: one thread accepts, one thread per connection reads requests
// (keep-alive) and writes the handler's responses. Beast parses; nothing here touches the
// wire format. A thread per connection suits a server whose handlers block until a batch
// has run, and it lets a handler ask whether its client is still connected (the socket
// has hung up) while it waits.
#pragma once

#include <atomic>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace trainyard {

struct HttpRequest {
  std::string method, target, body;
  std::map<std::string, std::string> headers;  // names lower-case
  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // an IP address, or "localhost"
  int port = 0;                    // 0: any free port; see HttpServer::port()
  size_t max_body_bytes = size_t(1) << 20;
  size_t max_connections = 64;
  std::string body_limit_setting;  // what the 400 for an oversized body names, e.g. "serve.max_body_mb"
  std::string log_name = "http";   // prefixes the log line of a handler that threw
  // A connection with no request for this long is closed (keep-alive idle timeout):
  // with a thread per connection, idle clients must not hold the slots forever.
  double idle_timeout_s = 60;
  // A request must arrive whole (headers and body) this long after its first bytes, or
  // it gets 408 and the connection is closed: a client trickling bytes (slowloris) must
  // not hold a connection thread either. Likewise a client that takes none of its response
  // for this long has its connection closed.
  double request_timeout_s = 30;
};

class HttpServer {
 public:
  // `client_gone()` is true once the client has closed its end; handlers that wait
  // poll it. Thread-safe handlers only: they run on many connection threads at once.
  using Handler = std::function<HttpResponse(const HttpRequest&, const std::function<bool()>& client_gone)>;

  // Binds host:port at once. Bodies over max_body_bytes get 400 and the connection
  // closed; connections beyond max_connections are closed at accept. Request bodies being read or handled at once
  // share a budget of max(64 MiB, 4 x max_body_bytes): a request that would overflow it
  // gets 429 before its body is read, so memory stays bounded whatever the clients send.
  // Throws std::runtime_error if it cannot bind.
  HttpServer(const HttpServerOptions& options, Handler handler);
  ~HttpServer();

  int port() const { return port_; }
  void Start();
  // Stops accepting, shuts every open connection down and joins the threads.
  void Stop();

 private:
  struct Impl;
  static constexpr size_t kMinBufferedBytes = size_t(64) << 20;
  void AcceptLoop();
  void Serve(int fd);
  // Waits for the next request's first bytes: false once the connection has been idle
  // for idle_timeout_s, or the server is stopping.
  bool AwaitRequest(int fd) const;
  // Turns Beast's request into ours and runs the handler; exceptions become 500.
  HttpResponse Dispatch(const boost::beast::http::request<boost::beast::http::string_body>& message,
                        const std::function<bool()>& client_gone, bool* keep_alive);

  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  size_t max_body_bytes_, max_buffered_bytes_, max_connections_;
  std::string body_limit_setting_, log_name_;
  double idle_timeout_s_, request_timeout_s_;
  std::atomic<size_t> buffered_bytes_{0};
  Handler handler_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mutex_;
  std::set<int> open_fds_;
  std::atomic<size_t> active_{0};
};

}  // namespace trainyard
