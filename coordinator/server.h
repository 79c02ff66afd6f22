// The coordinator daemon's request loop: a ZeroMQ ROUTER socket answering jobctl
// (and, later, workers) with protobuf Envelopes, over the SQLite state store.
//
// One thread owns the socket, the store and every piece of state. A frame that does
// not parse is counted and dropped, with an ErrorReply where the sender is known; no
// input can end the loop. Messages over `max_message_bytes` are refused by ZeroMQ
// itself (ZMQ_MAXMSGSIZE), which drops that peer's connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "coordinator/state_store.h"
#include "trainyard.pb.h"

namespace trainyard {

constexpr uint32_t kProtocolVersion = 1;

struct ServerOptions {
  std::string listen = "tcp://127.0.0.1:5555";
  std::string state_path = "trainyard.db";
  std::string runs_dir = "runs";
  bool fresh = false;
  int64_t max_message_bytes = 16 << 20;
};

class Server {
 public:
  // Opens the store (StoreError if it is corrupt and not `fresh`) and binds.
  explicit Server(ServerOptions options);
  // Serves until `stop` becomes true (checked every 100 ms).
  void Run(const std::atomic<bool>& stop);
  int64_t bad_frames() const { return bad_frames_; }
  std::string endpoint() const;

 private:
  void ReceiveOne();
  wire::Envelope Handle(const wire::Envelope& request);
  wire::Envelope Submit(const wire::SubmitRequest& request);
  wire::Envelope List();
  wire::Envelope Status(int64_t id);
  wire::Envelope Cancel(int64_t id);
  wire::Envelope Logs(const wire::LogsRequest& request);
  void Reply(const zmq::message_t& identity, const wire::Envelope& reply);

  ServerOptions options_;
  std::unique_ptr<StateStore> store_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  int64_t bad_frames_ = 0;
};

// An Envelope holding an ErrorReply.
wire::Envelope ErrorEnvelope(int code, const std::string& message);

}  // namespace trainyard
