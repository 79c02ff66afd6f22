// The coordinator's ZeroMQ Authentication Protocol handler (ZMTP RFC 27/ZAP).
//
// libzmq asks it, over inproc://zeromq.zap.01 in the coordinator's context, whether a
// peer that completed the CURVE handshake may connect. It admits a peer whose public
// key is on the worker or the client allowlist and names the role (and, for a client
// key with a name, the user it acts as: ZapUserId) as the ZAP "user id", which libzmq
// then attaches to every message from that peer (the "User-Id"
// property the coordinator reads). Any other key is refused during the handshake, so
// its frames never reach the coordinator's loop and nothing it sends is stored.
// One thread of its own; Replace() swaps the allowlists for the handshakes that follow
// (a handshake already admitted is never asked again).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/curve/curve_keys.h"
#include "common/log_limiter.h"

namespace trainyard {

class ZapHandler {
 public:
  // Binds the ZAP endpoint and starts answering. REQUIRES: `context` outlives this
  // object, and no other ZAP handler exists in it.
  ZapHandler(zmq::context_t& context, ServerKeys keys);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  int64_t refused() const { return refused_; }

  // What Replace() did: the new lists' sizes, and how many keys (of either list, a
  // client key counted with its name and role) came and went.
  struct Change {
    size_t workers = 0, clients = 0, added = 0, removed = 0;
  };
  // Answers with `keys`' allowlists from now on. Thread-safe.
  Change Replace(ServerKeys keys);
  std::string own_public_key() const;

 private:
  void Serve();
  void Answer(zmq::socket_t& socket);
  // The ZAP user id for the peer key `z85` (its Z85 text), or "" if it is not allowed.
  std::string UserIdOf(const std::string& z85) const;

  mutable std::mutex keys_mutex_;  // guards keys_: Replace() runs on the server's thread
  ServerKeys keys_;
  zmq::socket_t socket_;
  LogLimiter log_limiter_;  // the handler's thread's; refusals are logged at a bounded rate
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> refused_{0};
  std::thread thread_;
};

}  // namespace trainyard
