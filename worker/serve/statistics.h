// Per model version statistics in the shape of Triton's statistics extension
// (GET /v2/models[/<model>[/versions/<v>]]/stats, gRPC ModelStatistics), which tools
// built for Triton (perf_analyzer, its dashboards) read. Cumulative since the server
// started; kept per (model, version) the repository knows, so the book is bounded.
//
// What each figure means here:
//   success        requests answered with logits; ns from arrival to the answer
//   fail           requests of a known version that got an error (bad input, rejected,
//                  expired, failed, cancelled); ns from arrival to the error
//   queue          per successful request, arrival to its batch being sent to the model
//   compute_infer  per successful request, its batch's forward pass in the model process
//   inference_count  rows (texts) answered; execution_count  batches computed
//   batch_stats    per batch size (rows), the batches' forward passes
// compute_input and compute_output stay zero: tokenizing happens before queueing (in the
// request's own thread) and the logits come back with the forward pass's reply, so
// neither is a stage of its own.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace trainyard {

struct StatisticDuration {
  uint64_t count = 0, ns = 0;
  void Add(double ms);
};

struct VersionStatistics {
  std::string model;
  int64_t version = 0;
  uint64_t last_inference_ms = 0;  // wall clock, ms since the epoch; 0 before the first
  uint64_t inference_count = 0, execution_count = 0;
  StatisticDuration success, fail, queue, compute_infer;
  std::map<int64_t, StatisticDuration> batch_compute_infer;  // by rows in the batch
};

// Thread-safe: the transports' threads and the dispatcher record into it.
class StatisticsBook {
 public:
  void Succeeded(const std::string& model, int64_t version, int64_t rows, double total_ms, double queue_ms,
                 double compute_ms);
  void Failed(const std::string& model, int64_t version, double total_ms);
  void Executed(const std::string& model, int64_t version, int64_t rows, double compute_ms);
  // The statistics of (model, version); zeros where nothing was recorded yet.
  VersionStatistics Read(const std::string& model, int64_t version) const;

 private:
  VersionStatistics& Slot(const std::string& model, int64_t version);  // REQUIRES: mutex_ held

  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int64_t>, VersionStatistics> versions_;
};

}  // namespace trainyard
