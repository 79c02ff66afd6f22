#include "coordinator/zap_handler.h"

#include <spdlog/spdlog.h>
#include <zmq.h>

#include <set>
#include <vector>

#include "common/clock.h"

namespace trainyard {

ZapHandler::ZapHandler(zmq::context_t& context, ServerKeys keys)
    : keys_(std::move(keys)), socket_(context, zmq::socket_type::rep) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { Serve(); });
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  thread_.join();
}

void ZapHandler::Serve() {
  zmq::pollitem_t items[] = {{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0}};
  while (!stop_) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
      if (items[0].revents & ZMQ_POLLIN) Answer(socket_);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) spdlog::error("ZAP handler: {}", e.what());
    }
  }
}

std::string ZapHandler::UserIdOf(const std::string& z85) const {
  std::lock_guard<std::mutex> lock(keys_mutex_);
  if (keys_.workers.count(z85)) return ZapUserId(WireRole::kWorker, {z85, false});
  auto client = keys_.clients.find(z85);
  return client == keys_.clients.end() ? std::string() : ZapUserId(WireRole::kClient, client->second);
}

namespace {

// Every admission a key list grants, as text: a worker key, or a client key with its
// name and role (a key whose name or role changed counts as one removed and one added).
std::set<std::string> Admissions(const ServerKeys& keys) {
  std::set<std::string> out;
  for (const std::string& key : keys.workers) out.insert("worker " + key);
  for (const auto& [key, client] : keys.clients)
    out.insert("client " + key + " " + ZapUserId(WireRole::kClient, client));
  return out;
}

size_t CountMissing(const std::set<std::string>& from, const std::set<std::string>& in) {
  size_t n = 0;
  for (const std::string& item : from) n += in.count(item) == 0;
  return n;
}

}  // namespace

ZapHandler::Change ZapHandler::Replace(ServerKeys keys) {
  const std::set<std::string> now = Admissions(keys);
  std::lock_guard<std::mutex> lock(keys_mutex_);
  const std::set<std::string> before = Admissions(keys_);
  Change change;
  change.workers = keys.workers.size();
  change.clients = keys.clients.size();
  change.added = CountMissing(now, before);
  change.removed = CountMissing(before, now);
  keys_ = std::move(keys);
  return change;
}

std::string ZapHandler::own_public_key() const {
  std::lock_guard<std::mutex> lock(keys_mutex_);
  return keys_.own.public_key;
}

// Request: version, request id, domain, address, routing id, mechanism, credentials...
// Reply: version, request id, status code, status text, user id, metadata.
void ZapHandler::Answer(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    if (!socket.recv(frames.back(), zmq::recv_flags::none)) return;
  } while (frames.back().more());
  std::string status = "400", text = "no key", user;
  std::string address, mechanism;
  if (frames.size() >= 6) {
    address = frames[3].to_string();
    mechanism = frames[5].to_string();
  }
  if (frames.size() >= 7 && mechanism == "CURVE" && frames[6].size() == 32) {
    char z85[41] = {};
    zmq_z85_encode(z85, static_cast<const uint8_t*>(frames[6].data()), 32);
    user = UserIdOf(z85);
    status = user.empty() ? "400" : "200";
    text = user.empty() ? "key not allowed" : "OK";
  }
  if (status != "200") {
    ++refused_;
    if (int64_t left_out = 0; log_limiter_.Allow("zap", SteadySeconds(), &left_out))
      spdlog::warn("refused a {} connection from {}: {}{}", mechanism.empty() ? "malformed" : mechanism,
                   address.empty() ? "?" : address, text, LeftOutNote(left_out));
  }
  const std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
  const std::vector<std::string> reply = {"1.0", request_id, status, text, user, ""};
  for (size_t i = 0; i < reply.size(); ++i)
    socket.send(zmq::buffer(reply[i]), i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

}  // namespace trainyard
