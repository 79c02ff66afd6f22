// Parses job submissions off the coordinator's loop thread, so that no submission,
// however large or odd, can delay heartbeats or other requests. Torch-free.
//
// The loop Post()s a request and goes on serving. One background thread checks the
// text against a YamlBudget (size, nodes, depth: before yaml-cpp builds anything),
// then parses and validates it; each finished submission is queued and one byte on an
// inproc socket wakes the loop, which polls ready_socket() beside its ROUTER and then
// TakeDone()s the results. Storing the job and replying stay on the loop thread, which
// owns the store and the ROUTER socket.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/spec/job_spec.h"
#include "common/spec/search_spec.h"
#include "common/spec/yaml_budget.h"
#include "trainyard.pb.h"

namespace trainyard {

struct ParsedSubmission {
  std::string identity;  // the sender's routing id, to answer
  wire::SubmitRequest request;
  bool admin = true;                 // sent with an admin key: the policy for user keys does not apply
  std::optional<JobSpec> spec;       // set when the job file is valid
  std::optional<SearchSpec> search;  // set instead for a valid kind: search file
  std::string error;                 // otherwise, the one-line reason (file:line:col: field: ...)
};

class SubmitParser {
 public:
  // Binds the wake-up socket in `context`. REQUIRES: `context` outlives this object.
  SubmitParser(zmq::context_t& context, YamlBudget budget, size_t max_pending);
  ~SubmitParser();  // finishes the submission in hand, drops the rest, joins
  SubmitParser(const SubmitParser&) = delete;
  SubmitParser& operator=(const SubmitParser&) = delete;

  // False when `max_pending` submissions are already waiting: the caller answers "busy".
  // Loop thread only, like every member below.
  bool Post(std::string identity, wire::SubmitRequest request, bool admin);
  // Readable when TakeDone() has something.
  zmq::socket_t& ready_socket() { return ready_; }
  std::vector<ParsedSubmission> TakeDone();

 private:
  void Work(const std::string& wake_endpoint);
  ParsedSubmission Parse(std::string identity, wire::SubmitRequest request) const;

  zmq::context_t& context_;
  YamlBudget budget_;
  size_t max_pending_;
  zmq::socket_t ready_;
  std::mutex mutex_;
  std::condition_variable posted_;
  std::deque<ParsedSubmission> todo_;  // identity and request only
  std::vector<ParsedSubmission> done_;
  size_t in_flight_ = 0;  // posted and not yet taken
  bool quitting_ = false;
  std::thread thread_;
};

}  // namespace trainyard
