// Per-rank traces (log.trace) in the Chrome trace event format, which Perfetto and
// chrome://tracing open: each rank's step phases and each gradient bucket's all-reduce,
// one process per rank, merged into one file by rank 0 at the end of the job.
//
// Recording must cost next to nothing and stay small however long a job runs (Horovod's
// timeline grows without bound and slows steps down). So spans go into a ring that is
// allocated once: a span is a few integers written in place under an uncontended
// mutex, nothing is formatted or written while training, and only the spans of the
// last `keep_steps` steps are kept when the file is written.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace trainyard {

class TraceRecorder {
 public:
  // Tracks, as Chrome trace thread ids: the step's phases, and the all-reduces.
  static constexpr int kStepTrack = 0;
  static constexpr int kCommTrack = 1;

  // `spans_per_step`: room for that many spans of each kept step.
  TraceRecorder(int64_t keep_steps, size_t spans_per_step);

  // Microseconds on the steady clock.
  static int64_t NowUs();
  // Makes `now` the trace's time zero. Ranks call it right after a collective, so their
  // zeros line up to within that collective's skew.
  void SetOrigin(int64_t now_us) { origin_us_ = now_us; }
  // A span of global step `step` ("wait", "forward", "allreduce", ...). `name` must
  // outlive the recorder (a string literal); `bucket` >= 0 names a gradient bucket.
  void Span(const char* name, int track, int64_t step, int64_t start_us, int64_t end_us, int bucket = -1);

  // This rank's kept spans as Chrome trace events (pid = rank), with the process and
  // thread names, as a JSON array's elements (no brackets).
  std::string EventsJson(int rank) const;
  int64_t kept_steps() const { return keep_steps_; }

 private:
  struct Entry {
    const char* name = nullptr;
    int track = 0, bucket = -1;
    int64_t step = 0, start_us = 0, end_us = 0;
  };

  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  size_t next_ = 0;
  bool wrapped_ = false;
  int64_t keep_steps_, newest_step_ = 0, origin_us_ = 0;
};

// Writes {"traceEvents": [...]} from the ranks' EventsJson() texts, in rank order.
std::string ChromeTraceJson(const std::vector<std::string>& rank_events);

}  // namespace trainyard
