#include "common/trace_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace trainyard {

TraceRecorder::TraceRecorder(int64_t keep_steps, size_t spans_per_step)
    : ring_(size_t(std::max<int64_t>(1, keep_steps)) * std::max<size_t>(1, spans_per_step)),
      keep_steps_(std::max<int64_t>(1, keep_steps)) {}

int64_t TraceRecorder::NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void TraceRecorder::Span(const char* name, int track, int64_t step, int64_t start_us, int64_t end_us, int bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_[next_] = {name, track, bucket, step, start_us, std::max(start_us, end_us)};
  next_ = (next_ + 1) % ring_.size();
  wrapped_ = wrapped_ || next_ == 0;
  newest_step_ = std::max(newest_step_, step);
}

std::string TraceRecorder::EventsJson(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},"
                "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}},"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"step\"}},"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"all-reduce\"}}",
                rank, rank, rank, rank, rank, kStepTrack, rank, kCommTrack);
  out += line;
  const int64_t first_kept = newest_step_ - keep_steps_ + 1;
  const size_t count = wrapped_ ? ring_.size() : next_;
  const size_t oldest = wrapped_ ? next_ : 0;
  for (size_t i = 0; i < count; ++i) {  // oldest first
    const Entry& e = ring_[(oldest + i) % ring_.size()];
    if (!e.name || e.step < first_kept) continue;
    std::snprintf(line, sizeof line,
                  ",{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld,\"dur\":%lld,"
                  "\"args\":{\"step\":%lld",
                  e.name, e.track == kCommTrack ? "comm" : "step", rank, e.track,
                  static_cast<long long>(e.start_us - origin_us_), static_cast<long long>(e.end_us - e.start_us),
                  static_cast<long long>(e.step));
    out += line;
    if (e.bucket >= 0) out += ",\"bucket\":" + std::to_string(e.bucket);
    out += "}}";
  }
  return out;
}

std::string ChromeTraceJson(const std::vector<std::string>& rank_events) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  for (size_t i = 0; i < rank_events.size(); ++i) out += (i ? "," : "") + rank_events[i];
  return out + "]}\n";
}

}  // namespace trainyard
