#include "worker/serve/model_link.h"

#include <cstring>
#include <stdexcept>

#include "worker/serve/batcher.h"

namespace trainyard {

ModelLink::ModelLink(const std::string& endpoint) : socket_(context_, zmq::socket_type::pair) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.connect(endpoint);
}

void ModelLink::Send(const nlohmann::json& header, std::vector<zmq::message_t> frames) {
  const std::string text = header.dump();
  socket_.send(zmq::buffer(text), frames.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
  for (size_t i = 0; i < frames.size(); ++i)
    socket_.send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

void ModelLink::SendLoad(const VersionMeta& meta, const std::vector<std::pair<int, int>>& warm_shapes) {
  nlohmann::json warm = nlohmann::json::array();
  for (const auto& [rows, seq] : warm_shapes) warm.push_back({rows, seq});
  Send({{"op", "load"}, {"model", meta.model}, {"version", meta.version}, {"path", meta.path}, {"warm", warm}});
}

void ModelLink::SendUnload(const VersionMeta& meta) {
  Send({{"op", "unload"}, {"model", meta.model}, {"version", meta.version}});
}

void ModelLink::SendRun(uint64_t id, const Batch& batch) {
  const size_t cells = size_t(batch.rows) * batch.seq;
  zmq::message_t ids(cells * sizeof(int64_t)), mask(cells * sizeof(int64_t));
  auto* id_data = static_cast<int64_t*>(ids.data());
  auto* mask_data = static_cast<int64_t*>(mask.data());
  std::fill(id_data, id_data + cells, int64_t(batch.meta->pad_id));
  std::fill(mask_data, mask_data + cells, int64_t(0));
  size_t row = 0;
  for (const auto& request : batch.requests)
    for (const auto& tokens : request->rows()) {
      for (size_t t = 0; t < tokens.size(); ++t) {
        id_data[row * batch.seq + t] = tokens[t];
        mask_data[row * batch.seq + t] = 1;
      }
      ++row;
    }
  std::vector<zmq::message_t> frames;
  frames.push_back(std::move(ids));
  frames.push_back(std::move(mask));
  Send({{"op", "run"},
        {"id", id},
        {"model", batch.meta->model},
        {"version", batch.meta->version},
        {"rows", batch.rows},
        {"seq", batch.seq}},
       std::move(frames));
}

void ModelLink::SendStop() { Send({{"op", "stop"}}); }

std::optional<LinkReply> ModelLink::Receive(int timeout_ms) {
  zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
  try {
    if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 0) return std::nullopt;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::nullopt;  // a signal; the caller looks again
    throw;
  }
  zmq::message_t header;
  if (!socket_.recv(header)) return std::nullopt;
  LinkReply reply;
  const nlohmann::json h = nlohmann::json::parse(header.to_string_view());
  reply.op = h.value("op", "");
  reply.ok = h.value("ok", false);
  reply.error = h.value("error", "");
  reply.id = h.value("id", uint64_t(0));
  reply.compute_ms = h.value("compute_ms", 0.0);
  reply.model = h.value("model", "");
  reply.version = h.value("version", int64_t(0));
  reply.ms_per_token = h.value("ms_per_token", -1.0);
  reply.ms_per_batch = h.value("ms_per_batch", -1.0);
  reply.warm_ms = h.contains("warm_ms") ? h["warm_ms"].dump() : "";
  while (socket_.get(zmq::sockopt::rcvmore)) {
    zmq::message_t frame;
    (void)socket_.recv(frame);
    reply.logits.resize(frame.size() / sizeof(float));
    std::memcpy(reply.logits.data(), frame.data(), reply.logits.size() * sizeof(float));
  }
  return reply;
}

}  // namespace trainyard
