// The link between the serving front end (this folder's `serve_frontend`, torch-free:
// HTTP, gRPC, batching) and the model process (the worker running `kind: serve`, which
// holds the weights and runs the forward passes). Why two processes: gRPC needs the
// shared libprotobuf, while the worker links protobuf statically with its symbols
// hidden because Debian's libsentencepiece exports an older protobuf; keeping gRPC, the
// HTTP server and their threads in a process without libtorch avoids that clash, keeps
// the I/O threads off the cores the forward passes use, and lets a crash of either end
// be seen by the other.
//
// The protocol. One ZeroMQ PAIR socket over ipc://; the worker binds, the front end
// connects. Every message is a JSON header frame, then binary frames for tensors (raw,
// little-endian, row major). The model process handles messages in order, so a batch
// sent before an unload of its version always runs first.
//   front end -> model
//     {"op":"load","model":M,"version":V,"path":P,"warm":[[rows,seq],...]}
//         load the HF folder P (off the batch thread) and run one forward pass per
//         warm shape before answering `loaded`
//     {"op":"unload","model":M,"version":V}       free that version
//     {"op":"run","id":N,"model":M,"version":V,"rows":B,"seq":T} + ids + mask
//         ids and mask: int64 [B, T]; answered by `result`
//     {"op":"stop"}                                 the model process ends the job
//   model -> front end
//     {"op":"hello"}                                sent once the socket is bound
//     {"op":"loaded","model":M,"version":V,"ok":bool,"error":S,"warm_ms":[..],"labels":C}
//     {"op":"result","id":N,"ok":bool,"error":S,"compute_ms":X,"labels":C} + logits
//         logits: float32 [B, C]
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

namespace trainyard {

struct VersionMeta;
struct Batch;

// What the model process answered, decoded.
struct LinkReply {
  std::string op;  // "result" or "loaded"
  bool ok = false;
  std::string error;
  uint64_t id = 0;            // result: the batch
  double compute_ms = 0;      // result: the forward pass
  std::vector<float> logits;  // result
  std::string model;          // loaded
  int64_t version = 0;        // loaded
  double ms_per_token = -1;   // loaded: the warm-up's cost fit; -1 when it had too few shapes
  double ms_per_batch = -1;
  std::string warm_ms;  // loaded: each warm-up shape's time, for the log
};

// The front end's end of the link. Not thread-safe: the dispatcher thread owns it.
class ModelLink {
 public:
  // Connects to `endpoint` (ipc://...). Throws zmq::error_t.
  explicit ModelLink(const std::string& endpoint);

  void SendLoad(const VersionMeta& meta, const std::vector<std::pair<int, int>>& warm_shapes);
  void SendUnload(const VersionMeta& meta);
  // Pads every row of the batch to batch.seq with the version's pad id (mask 0).
  void SendRun(uint64_t id, const Batch& batch);
  void SendStop();
  // The next reply, waiting up to timeout_ms; nullopt when none came.
  std::optional<LinkReply> Receive(int timeout_ms);

 private:
  void Send(const nlohmann::json& header, std::vector<zmq::message_t> frames = {});

  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

}  // namespace trainyard
