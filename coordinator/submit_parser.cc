#include "coordinator/submit_parser.h"

#include <cstdio>

namespace trainyard {

SubmitParser::SubmitParser(zmq::context_t& context, YamlBudget budget, size_t max_pending)
    : context_(context), budget_(budget), max_pending_(max_pending), ready_(context, zmq::socket_type::pull) {
  char endpoint[64];
  std::snprintf(endpoint, sizeof endpoint, "inproc://ty-submit-parser-%p", static_cast<void*>(this));
  ready_.set(zmq::sockopt::linger, 0);
  ready_.bind(endpoint);  // before the thread connects
  thread_ = std::thread([this, wake = std::string(endpoint)] { Work(wake); });
}

SubmitParser::~SubmitParser() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quitting_ = true;
  }
  posted_.notify_all();
  thread_.join();
}

bool SubmitParser::Post(std::string identity, wire::SubmitRequest request, bool admin) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_ >= max_pending_) return false;
    ++in_flight_;
    ParsedSubmission item;
    item.identity = std::move(identity);
    item.request = std::move(request);
    item.admin = admin;
    todo_.push_back(std::move(item));
  }
  posted_.notify_one();
  return true;
}

std::vector<ParsedSubmission> SubmitParser::TakeDone() {
  zmq::message_t byte;
  while (ready_.recv(byte, zmq::recv_flags::dontwait)) {
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ParsedSubmission> out;
  out.swap(done_);
  in_flight_ -= out.size();
  return out;
}

void SubmitParser::Work(const std::string& wake_endpoint) {
  zmq::socket_t wake(context_, zmq::socket_type::push);
  wake.set(zmq::sockopt::linger, 0);
  wake.connect(wake_endpoint);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    posted_.wait(lock, [this] { return quitting_ || !todo_.empty(); });
    if (quitting_) return;
    ParsedSubmission item = std::move(todo_.front());
    todo_.pop_front();
    lock.unlock();
    ParsedSubmission parsed = Parse(std::move(item.identity), std::move(item.request));
    parsed.admin = item.admin;
    lock.lock();
    done_.push_back(std::move(parsed));
    wake.send(zmq::str_buffer("!"), zmq::send_flags::dontwait);  // a full pipe already means "wake up"
  }
}

ParsedSubmission SubmitParser::Parse(std::string identity, wire::SubmitRequest request) const {
  ParsedSubmission out;
  out.identity = std::move(identity);
  try {
    CheckYamlBudget(request.yaml(), request.source(), budget_);
    if (IsSearchFile(request.yaml())) {
      CheckYamlBudget(request.search_base_yaml(), request.search_base_path(), budget_);
      const SearchBaseFile sent{request.search_base_path(), request.search_base_yaml()};
      out.search = ParseSearchSpec(request.yaml(), request.source(), request.base_dir(), &sent);
    } else {
      out.spec = ParseJobSpec(request.yaml(), request.source(), request.base_dir());
    }
  } catch (const SpecError& e) {
    out.error = e.what();
  } catch (const std::exception& e) {  // a parser bug must not end the thread, nor the daemon
    out.error = request.source() + ": cannot be parsed: " + e.what();
  }
  out.request = std::move(request);
  return out;
}

}  // namespace trainyard
