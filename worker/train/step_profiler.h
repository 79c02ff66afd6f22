// Profiles a window of training steps with libtorch's Kineto profiler (`log.profile_steps`),
// so "why is this step slow?" is answered by operator, not guessed.
//
// The window opens at the start of global step `first` and closes after `count` steps.
// Closing writes two files into the run folder (with `.rank<R>` before the extension
// when there are several ranks): profile.json, a Chrome trace (open it in Perfetto or
// chrome://tracing), and profile.txt, a table of operators by self time: the
// time spent in an operator minus the time of the operators it called on the same thread,
// so the rows add up to the profiled time without counting anything twice. On CUDA the
// table also has the kernels' device time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard {

struct OperatorTime {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0, total_ms = 0;
  bool device = false;  // a CUDA kernel or copy (device time), not a host operator
};

// Event times as the profiler reports them, for SelfTimes.
struct ProfiledEvent {
  std::string name;
  uint64_t thread = 0, start_ns = 0, end_ns = 0;
  bool device = false;
};

// Per-name totals, sorted by self time, largest first. An event's self time is its
// duration less that of the events directly nested in it on the same thread.
std::vector<OperatorTime> SelfTimes(std::vector<ProfiledEvent> events);

// The table profile.txt holds: one row per operator, with its share of the profiled time.
std::string FormatOperatorTable(const std::vector<OperatorTime>& rows, int steps, size_t max_rows = 40);

class StepProfiler {
 public:
  // `count` = 0 disables it. `first` is a 1-based global step. The files are
  // `path_prefix`.json and `path_prefix`.txt.
  StepProfiler(std::string path_prefix, int64_t first, int64_t count, bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Call before step `step` (1-based) starts and after it ends.
  void BeforeStep(int64_t step);
  void AfterStep(int64_t step);

 private:
  void Finish();

  std::string path_prefix_;
  int64_t first_, count_;
  bool cuda_, active_ = false;
  int64_t profiled_ = 0;  // steps seen since the window opened
};

}  // namespace trainyard
