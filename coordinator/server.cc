#include "coordinator/server.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "proto/job_spec.h"

namespace trainyard {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void Fill(const JobRecord& j, wire::JobInfo* info) {
  info->set_id(j.id);
  info->set_name(j.name);
  info->set_state(ToString(j.state));
  info->set_priority(j.priority);
  info->set_ranks(j.ranks);
  info->set_device(j.device);
  info->set_attempts(j.attempts);
  info->set_reason(j.reason);
  info->set_submitted_at(j.submitted_at);
}

}  // namespace

wire::Envelope ErrorEnvelope(int code, const std::string& message) {
  wire::Envelope e;
  e.set_version(kProtocolVersion);
  e.mutable_error()->set_code(code);
  e.mutable_error()->set_message(message);
  return e;
}

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      store_(std::make_unique<StateStore>(options_.state_path, options_.fresh)),
      context_(1),
      socket_(context_, zmq::socket_type::router) {
  socket_.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::router_mandatory, 0);
  socket_.bind(options_.listen);
}

std::string Server::endpoint() const { return socket_.get(zmq::sockopt::last_endpoint); }

void Server::Run(const std::atomic<bool>& stop) {
  zmq::pollitem_t items[] = {{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0}};
  while (!stop) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // a signal; `stop` says whether to go on
      throw;
    }
    if (items[0].revents & ZMQ_POLLIN) ReceiveOne();
  }
}

void Server::ReceiveOne() {
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    if (!socket_.recv(frames.back(), zmq::recv_flags::dontwait)) {
      frames.pop_back();
      break;
    }
  } while (frames.back().more());
  // [identity, payload] from a DEALER, or [identity, empty, payload] from a REQ.
  if (frames.size() == 3 && frames[1].size() == 0) frames.erase(frames.begin() + 1);
  if (frames.size() != 2) {
    ++bad_frames_;
    spdlog::warn("dropped a message of {} frames (expected 2); {} bad so far", frames.size(), bad_frames_);
    if (!frames.empty()) Reply(frames[0], ErrorEnvelope(2, "expected one protobuf Envelope frame"));
    return;
  }
  wire::Envelope request;
  if (!request.ParseFromArray(frames[1].data(), static_cast<int>(frames[1].size())) ||
      request.body_case() == wire::Envelope::BODY_NOT_SET) {
    ++bad_frames_;
    spdlog::warn("dropped a frame that is not a trainyard Envelope ({} bytes); {} bad so far", frames[1].size(),
                 bad_frames_);
    Reply(frames[0], ErrorEnvelope(2, "the message is not a valid trainyard Envelope"));
    return;
  }
  if (request.version() != kProtocolVersion) {
    Reply(frames[0], ErrorEnvelope(2, "protocol version " + std::to_string(request.version()) +
                                          " is not supported (this coordinator speaks " +
                                          std::to_string(kProtocolVersion) + ")"));
    return;
  }
  try {
    Reply(frames[0], Handle(request));
  } catch (const std::exception& e) {  // a failed request never ends the daemon
    spdlog::error("request failed: {}", e.what());
    Reply(frames[0], ErrorEnvelope(1, e.what()));
  }
}

void Server::Reply(const zmq::message_t& identity, const wire::Envelope& reply) {
  std::string bytes = reply.SerializeAsString();
  socket_.send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
}

wire::Envelope Server::Handle(const wire::Envelope& request) {
  switch (request.body_case()) {
    case wire::Envelope::kSubmit: return Submit(request.submit());
    case wire::Envelope::kList: return List();
    case wire::Envelope::kStatus: return Status(request.status().job_id());
    case wire::Envelope::kCancel: return Cancel(request.cancel().job_id());
    case wire::Envelope::kLogs: return Logs(request.logs());
    default: return ErrorEnvelope(2, "this coordinator does not accept that message");
  }
}

wire::Envelope Server::Submit(const wire::SubmitRequest& request) {
  JobSpec spec;
  try {
    spec = ParseJobSpec(request.yaml(), request.source(), request.base_dir());
  } catch (const SpecError& e) {
    return ErrorEnvelope(2, e.what());  // rejected before anything is written
  }
  NewJob job;
  job.name = spec.name, job.idempotency_key = request.idempotency_key(), job.spec_yaml = request.yaml();
  job.source = request.source(), job.device = spec.resources.device, job.priority = spec.resources.priority;
  job.ranks = spec.resources.ranks, job.max_restarts = spec.resources.max_restarts;
  bool created = false;
  JobRecord record = store_->Submit(job, Now(), &created);  // committed before the reply
  if (created) spdlog::info("job {} '{}' queued ({} ranks, priority {})", record.id, record.name, record.ranks,
                            record.priority);
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  reply.mutable_submitted()->set_job_id(record.id);
  reply.mutable_submitted()->set_created(created);
  return reply;
}

wire::Envelope Server::List() {
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  wire::ListReply* jobs = reply.mutable_jobs();  // set even when empty: it is the reply's body
  for (const JobRecord& j : store_->Jobs()) Fill(j, jobs->add_jobs());
  return reply;
}

wire::Envelope Server::Status(int64_t id) {
  auto job = store_->Find(id);
  if (!job) return ErrorEnvelope(2, "no job " + std::to_string(id));
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  Fill(*job, reply.mutable_job());
  for (const auto& event : store_->Events(id)) reply.mutable_job()->add_events(event);
  return reply;
}

wire::Envelope Server::Cancel(int64_t id) {
  auto job = store_->Find(id);
  if (!job) return ErrorEnvelope(2, "no job " + std::to_string(id));
  if (job->state == JobState::kQueued) {
    store_->SetState(id, JobState::kCancelled, "cancelled while queued");
    store_->AddEvent(id, "cancelled while queued", Now());
    spdlog::info("job {} cancelled", id);
  } else if (job->state == JobState::kRunning) {
    return ErrorEnvelope(1, "job " + std::to_string(id) + " is running; this coordinator has no worker pool to stop it");
  }
  return Status(id);
}

wire::Envelope Server::Logs(const wire::LogsRequest& request) {
  auto job = store_->Find(request.job_id());
  if (!job) return ErrorEnvelope(2, "no job " + std::to_string(request.job_id()));
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  reply.mutable_log_rows();
  auto rows = store_->EpochRows(request.job_id());
  for (size_t i = static_cast<size_t>(std::max(0, request.after())); i < rows.size(); ++i)
    reply.mutable_log_rows()->add_csv_lines(rows[i].csv_line);
  reply.mutable_log_rows()->set_state(ToString(job->state));
  return reply;
}

}  // namespace trainyard
