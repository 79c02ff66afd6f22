#include "worker/serve/infer_request.h"

#include <algorithm>
#include <cmath>

namespace trainyard {

ServeClock::time_point DeadlineAfter(double timeout_ms, double default_ms) {
  const double ms = std::isfinite(timeout_ms) && timeout_ms > 0 ? timeout_ms : default_ms;
  return ServeClock::now() + std::chrono::duration_cast<ServeClock::duration>(
                                 std::chrono::duration<double, std::milli>(std::min(ms, kMaxTimeoutMs)));
}

const char* OutcomeName(InferStatus status) {
  switch (status) {
    case InferStatus::kOk:
      return "ok";
    case InferStatus::kBadInput:
      return "bad_input";
    case InferStatus::kNotFound:
      return "not_found";
    case InferStatus::kUnavailable:
      return "unavailable";
    case InferStatus::kRejected:
      return "rejected";
    case InferStatus::kExpired:
      return "expired";
    case InferStatus::kCancelled:
      return "cancelled";
    case InferStatus::kFailed:
      return "failed";
  }
  return "failed";
}

int HttpStatus(InferStatus status) {
  switch (status) {
    case InferStatus::kOk:
      return 200;
    case InferStatus::kBadInput:
    case InferStatus::kNotFound:
      return 400;
    case InferStatus::kUnavailable:
      return 503;
    case InferStatus::kRejected:
      return 429;
    case InferStatus::kExpired:
      return 504;
    case InferStatus::kCancelled:
      return 499;
    case InferStatus::kFailed:
      return 500;
  }
  return 500;
}

InferRequest::InferRequest(std::shared_ptr<const VersionMeta> meta, std::vector<std::vector<int32_t>> rows,
                           int priority, ServeClock::time_point deadline)
    : meta_(std::move(meta)),
      rows_(std::move(rows)),
      priority_(priority),
      arrival_(ServeClock::now()),
      deadline_(deadline) {
  for (const auto& row : rows_) {
    longest_ = std::max(longest_, static_cast<int>(row.size()));
    real_tokens_ += static_cast<int64_t>(row.size());
  }
}

void InferRequest::Finish(InferStatus status, std::string message, std::vector<float> logits) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    status_ = status;
    message_ = std::move(message);
    logits_ = std::move(logits);
  }
  finished_cv_.notify_all();
}

void InferRequest::SetTimings(double queue_ms, double compute_ms, int batch_rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_ms_ = queue_ms;
  compute_ms_ = compute_ms;
  batch_rows_ = batch_rows;
}

void InferRequest::Wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  finished_cv_.wait(lock, [&] { return finished_; });
}

bool InferRequest::WaitFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return finished_cv_.wait_for(lock, timeout, [&] { return finished_; });
}

}  // namespace trainyard
