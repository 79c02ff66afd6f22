// A small HTTP/1.1 server on Boost.Beast's asynchronous model, shared by serving's front
// end and the coordinator's dashboard.
//
// One thread runs an io_context that accepts, reads and writes every connection: a
// connection costs a socket and a few KB, never a thread, so idle or slow clients cannot
// use the server up. A request read whole is handed to a handler on a pool of threads
// (handlers may block: serving's waits for its batch) and its response is written back
// by the io thread. Beast parses; nothing here touches the wire format.
//
// The limits, each answered rather than silent:
//   - a request's headers and body must arrive within request_timeout_s of its first
//     byte (else 408); a connection with no request for idle_timeout_s is closed;
//   - bodies over max_body_bytes get 400; bodies being read or handled at once share a
//     budget of max(64 MiB, 4 x max_body_bytes), and a request that would overflow it
//     gets 429 before its body is read;
//   - at max_connections, or at max_connections_per_peer from one address, a new
//     connection takes the place of the one that has waited longest without a request
//     in hand (idle, or trickling one in); when every connection is busy it gets 503 with
//     Retry-After and is closed;
//   - when every handler thread is busy and max_waiting_requests wait for one, a request
//     gets 503 with Retry-After.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
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
  size_t max_connections = 1024;
  std::string body_limit_setting;       // what the 400 for an oversized body names, e.g. "serve.max_body_mb"
  std::string log_name = "http";        // prefixes the log line of a handler that threw
  double idle_timeout_s = 60;           // keep-alive: a connection with no request this long is closed
  double request_timeout_s = 30;        // a request must arrive whole, and its response be taken, within this
  size_t max_connections_per_peer = 0;  // 0: max_connections
  size_t handler_threads = 16;          // started as needed, up to this many
  size_t max_waiting_requests = 1024;   // read whole, waiting for a handler thread
};

class HttpServer {
 public:
  // `client_gone()` is true once the client has closed its end; handlers that wait
  // poll it. Thread-safe handlers only: they run on many pool threads at once.
  using Handler = std::function<HttpResponse(const HttpRequest&, const std::function<bool()>& client_gone)>;

  // Binds host:port at once, and raises this process's open-file limit as far as the
  // hard limit allows toward what max_connections needs. Throws std::runtime_error if it
  // cannot bind.
  HttpServer(const HttpServerOptions& options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  void Start();
  // Stops accepting, ends every connection, lets running handlers finish (their
  // client_gone() turns true) and joins every thread. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace trainyard
