// The front end's gRPC listener: the front end accepts gRPC's TCP connections itself and
// hands each to the gRPC server, so that their number is bounded.
//
// Note [gRPC connections are gated]
// Debian 12's gRPC (1.51) has no cap on incoming connections, and a connection that
// never sends a request holds its descriptor for as long as its client likes: 20,000
// idle TCP connections take every descriptor of the process, HTTP's included. So the
// front end listens for gRPC itself and passes each accepted connection to the gRPC
// server (grpc::AddInsecureChannelFromFd), keeping a duplicate of its descriptor to
// watch it by:
//   - at most max_connections are held. At the cap, the connection that has received
//     nothing for longest (the kernel's TCP_INFO, tcpi_last_data_recv), if that is at
//     least min_idle_s, is shut down to make room, as the HTTP server closes its longest
//     waiting connection; when every one has been active more recently, the new one is
//     closed at once (counted as refused);
//   - a connection gRPC has closed shows as a TCP state other than ESTABLISHED on the
//     duplicate (gRPC shuts its sockets down before closing them), and is forgotten;
//   - shutting the duplicate down ends the connection for gRPC too, and no descriptor
//     number gRPC may have reused is ever touched: the gate only uses its own.
// Each held connection costs two descriptors. gRPC's own max_connection_idle closes
// connections that carry no call for serve.keep_alive_s (grpc_service.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

namespace grpc {
class Server;
}

namespace trainyard {

struct GrpcGateOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  size_t max_connections = 1024;
  double min_idle_s = 1;  // a connection silent this long may be closed for a new one
};

class GrpcConnectionGate {
 public:
  // Binds host:port now; throws std::runtime_error if it cannot. REQUIRES: `server` was
  // built without a listening port of its own and outlives this gate.
  GrpcConnectionGate(grpc::Server* server, const GrpcGateOptions& options);
  ~GrpcConnectionGate();  // Stop()
  GrpcConnectionGate(const GrpcConnectionGate&) = delete;
  GrpcConnectionGate& operator=(const GrpcConnectionGate&) = delete;

  int port() const { return port_; }
  void Start();
  // Stops accepting and forgets the held connections (gRPC keeps them until its own
  // Shutdown). Idempotent.
  void Stop();
  // Connections closed at once because every held one was active, and held ones closed
  // to make room: for tests and logs.
  size_t refused() const { return refused_; }
  size_t evicted() const { return evicted_; }

 private:
  struct Held {
    int watch_fd;  // the gate's duplicate of the connection's descriptor
  };
  void Loop();
  void AcceptAll();
  void Admit(int fd);
  void ForgetClosed();
  bool EvictQuietest();

  grpc::Server* server_;
  GrpcGateOptions options_;
  int listen_fd_ = -1, wake_read_ = -1, wake_write_ = -1, port_ = 0;
  std::vector<Held> held_;  // loop thread only
  std::atomic<size_t> refused_{0}, evicted_{0};
  std::chrono::steady_clock::time_point accept_paused_until_{}, last_warned_{};
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace trainyard
