#include "worker/serve/statistics.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace trainyard {
namespace {

uint64_t WallClockMs() {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

}  // namespace

void StatisticDuration::Add(double ms) {
  ++count;
  ns += uint64_t(std::llround(std::max(0.0, ms) * 1e6));
}

VersionStatistics& StatisticsBook::Slot(const std::string& model, int64_t version) {
  VersionStatistics& s = versions_[{model, version}];
  s.model = model;
  s.version = version;
  return s;
}

void StatisticsBook::Succeeded(const std::string& model, int64_t version, int64_t rows, double total_ms,
                               double queue_ms, double compute_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  VersionStatistics& s = Slot(model, version);
  s.success.Add(total_ms);
  s.queue.Add(queue_ms);
  s.compute_infer.Add(compute_ms);
  s.inference_count += uint64_t(rows);
  s.last_inference_ms = WallClockMs();
}

void StatisticsBook::Failed(const std::string& model, int64_t version, double total_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  VersionStatistics& s = Slot(model, version);
  s.fail.Add(total_ms);
  s.last_inference_ms = WallClockMs();
}

void StatisticsBook::Executed(const std::string& model, int64_t version, int64_t rows, double compute_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  VersionStatistics& s = Slot(model, version);
  ++s.execution_count;
  s.batch_compute_infer[rows].Add(compute_ms);
}

VersionStatistics StatisticsBook::Read(const std::string& model, int64_t version) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = versions_.find({model, version});
  if (it != versions_.end()) return it->second;
  VersionStatistics empty;
  empty.model = model;
  empty.version = version;
  return empty;
}

}  // namespace trainyard
