// One inference request on its way through the server: made by a transport (HTTP or
// gRPC), queued and batched by the dispatcher, answered by the model process. The
// transport's thread waits on it; the dispatcher's thread finishes it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/serve/model_repository.h"

namespace trainyard {

using ServeClock = std::chrono::steady_clock;

// How a request ended, and what each transport answers for it.
enum class InferStatus {
  kOk,           // 200 / OK
  kBadInput,     // 400 / INVALID_ARGUMENT: the request itself is at fault
  kNotFound,     // 400 / NOT_FOUND: unknown model or version (KServe answers 400 over HTTP)
  kUnavailable,  // 503 / UNAVAILABLE: the model is not ready
  kRejected,     // 429 / RESOURCE_EXHAUSTED: the queue is full, or the deadline cannot be met
  kExpired,      // 504 / DEADLINE_EXCEEDED: the deadline passed while queued
  kCancelled,    // the client went away; nobody reads the answer
  kFailed,       // 500 / INTERNAL: the model process failed the batch
};

const char* OutcomeName(InferStatus status);  // the `outcome` label of the metrics
int HttpStatus(InferStatus status);

// A request's deadline: `timeout_ms` from now (the client's, when it gave a positive
// finite one), else `default_ms`; at most kMaxTimeoutMs (an hour) from now, so that a
// huge timeout (1e30 us) means "an hour", not a time point that overflows into the past.
inline constexpr double kMaxTimeoutMs = 3'600'000.0;
ServeClock::time_point DeadlineAfter(double timeout_ms, double default_ms);

class InferRequest {
 public:
  // REQUIRES: rows non-empty, each row non-empty and at most meta->max_tokens long.
  InferRequest(std::shared_ptr<const VersionMeta> meta, std::vector<std::vector<int32_t>> rows, int priority,
               ServeClock::time_point deadline);

  const VersionMeta& meta() const { return *meta_; }
  const std::shared_ptr<const VersionMeta>& meta_ptr() const { return meta_; }
  const std::vector<std::vector<int32_t>>& rows() const { return rows_; }
  int longest() const { return longest_; }
  int64_t real_tokens() const { return real_tokens_; }
  int priority() const { return priority_; }  // lower runs first; 0 is the default level
  ServeClock::time_point arrival() const { return arrival_; }
  ServeClock::time_point deadline() const { return deadline_; }

  // Thread-safe. A cancelled request still queued is dropped, never computed.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  // How the transport tells that its client has gone (a hung-up socket, a cancelled
  // call). Set before Submit; the dispatcher asks it of queued requests now and then
  // (Batcher::SweepGone), so the transport's thread can simply wait. It must stay
  // callable until the request is finished.
  void SetClientGone(std::function<bool()> client_gone) { client_gone_ = std::move(client_gone); }
  bool ClientGone() const { return client_gone_ && client_gone_(); }

  // The dispatcher's side: called once. `logits` is [rows x labels], row major.
  void Finish(InferStatus status, std::string message, std::vector<float> logits = {});
  void SetTimings(double queue_ms, double compute_ms, int batch_rows);

  // The transport's side: waits up to `timeout` for Finish; true when finished.
  bool WaitFor(std::chrono::milliseconds timeout);
  // Waits for Finish (every submitted request gets one: an answer, a refusal, expiry,
  // cancellation, or the server stopping).
  void Wait();
  // Valid after WaitFor returned true.
  InferStatus status() const { return status_; }
  const std::string& message() const { return message_; }
  const std::vector<float>& logits() const { return logits_; }
  double queue_ms() const { return queue_ms_; }
  double compute_ms() const { return compute_ms_; }

 private:
  std::shared_ptr<const VersionMeta> meta_;
  std::vector<std::vector<int32_t>> rows_;
  int longest_ = 0;
  int64_t real_tokens_ = 0;
  int priority_ = 0;
  ServeClock::time_point arrival_, deadline_;
  std::atomic<bool> cancelled_{false};
  std::function<bool()> client_gone_;

  std::mutex mutex_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  InferStatus status_ = InferStatus::kFailed;
  std::string message_;
  std::vector<float> logits_;
  double queue_ms_ = 0, compute_ms_ = 0;
  int batch_rows_ = 0;
};

using RequestPtr = std::shared_ptr<InferRequest>;

}  // namespace trainyard
