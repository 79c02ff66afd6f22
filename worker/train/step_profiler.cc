#include "worker/train/step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "common/log.h"

namespace trainyard {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

std::set<ActivityType> Activities(bool cuda) {
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  return activities;
}

std::vector<ProfiledEvent> EventsOf(const kineto::ProfilerResult& result) {
  std::vector<ProfiledEvent> events;
  for (const auto& e : result.events()) {
    if (e.isHiddenEvent() || e.endNs() < e.startNs()) continue;
    const bool device = e.deviceType() != c10::DeviceType::CPU;
    // Device events have no host thread; their "thread" is the stream, so kernels on
    // one stream nest like calls on one thread (they never overlap).
    events.push_back(
        {e.name(), device ? uint64_t(e.deviceResourceId()) : e.startThreadId(), e.startNs(), e.endNs(), device});
  }
  return events;
}

}  // namespace

std::vector<OperatorTime> SelfTimes(std::vector<ProfiledEvent> events) {
  // Per thread, in start order (the longer first when two start together, so a parent
  // precedes its child); a stack of the open events finds each one's parent.
  std::sort(events.begin(), events.end(), [](const ProfiledEvent& a, const ProfiledEvent& b) {
    return std::make_tuple(a.device, a.thread, a.start_ns, b.end_ns) <
           std::make_tuple(b.device, b.thread, b.start_ns, a.end_ns);
  });
  std::map<std::pair<bool, std::string>, OperatorTime> by_name;
  std::vector<double> child_ns(events.size(), 0.0);
  std::vector<size_t> open;
  for (size_t i = 0; i < events.size(); ++i) {
    const ProfiledEvent& e = events[i];
    while (!open.empty()) {
      const ProfiledEvent& top = events[open.back()];
      if (top.device == e.device && top.thread == e.thread && e.start_ns < top.end_ns) break;
      open.pop_back();
    }
    const double duration = double(e.end_ns - e.start_ns);
    if (!open.empty()) child_ns[open.back()] += std::min(duration, double(events[open.back()].end_ns - e.start_ns));
    open.push_back(i);
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const ProfiledEvent& e = events[i];
    OperatorTime& row = by_name[{e.device, e.name}];
    row.name = e.name;
    row.device = e.device;
    ++row.calls;
    const double duration = double(e.end_ns - e.start_ns);
    row.total_ms += duration / 1e6;
    row.self_ms += std::max(0.0, duration - child_ns[i]) / 1e6;
  }
  std::vector<OperatorTime> rows;
  for (auto& [key, row] : by_name) rows.push_back(std::move(row));
  std::sort(rows.begin(), rows.end(), [](const OperatorTime& a, const OperatorTime& b) {
    return std::tie(a.device, b.self_ms) < std::tie(b.device, a.self_ms);
  });
  return rows;
}

std::string FormatOperatorTable(const std::vector<OperatorTime>& rows, int steps, size_t max_rows) {
  std::string out;
  for (bool device : {false, true}) {
    double all_self = 0;
    for (const auto& r : rows)
      if (r.device == device) all_self += r.self_ms;
    if (all_self <= 0) continue;
    out += StrFormat("%s time over %d steps: %.2f ms, %.3f ms/step\n", device ? "device (CUDA)" : "host (CPU)", steps,
                     all_self, all_self / std::max(1, steps));
    out += StrFormat("%-58s %8s %12s %7s %12s %12s\n", "operator", "calls", "self ms/step", "self %", "total ms/step",
                     "us/call");
    size_t shown = 0;
    for (const auto& r : rows) {
      if (r.device != device || shown++ >= max_rows) continue;
      std::string name = r.name.size() > 58 ? r.name.substr(0, 55) + "..." : r.name;
      out += StrFormat("%-58s %8ld %12.3f %6.1f%% %12.3f %12.1f\n", name.c_str(), long(r.calls),
                       r.self_ms / std::max(1, steps), 100.0 * r.self_ms / all_self, r.total_ms / std::max(1, steps),
                       1000.0 * r.self_ms / double(std::max<int64_t>(1, r.calls)));
    }
    out += "\n";
  }
  return out;
}

StepProfiler::StepProfiler(std::string path_prefix, int64_t first, int64_t count, bool cuda)
    : path_prefix_(std::move(path_prefix)), first_(first), count_(count), cuda_(cuda) {
  if (count_ > 0)
    kineto::prepareProfiler(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO),
                            Activities(cuda_));
}

StepProfiler::~StepProfiler() {
  if (!active_) return;
  try {
    Finish();
  } catch (const std::exception& e) {
    LogWarn(std::string("profile not written: ") + e.what());
  }
}

void StepProfiler::BeforeStep(int64_t step) {
  if (count_ <= 0 || active_ || step != first_) return;
  kineto::enableProfiler(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO),
                         Activities(cuda_));
  active_ = true;
}

void StepProfiler::AfterStep(int64_t step) {
  if (!active_) return;
  ++profiled_;
  if (step >= first_ + count_ - 1) Finish();
}

void StepProfiler::Finish() {
  active_ = false;
  count_ = 0;
  if (cuda_) torch::cuda::synchronize();
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  const std::string trace = path_prefix_ + ".json", table = path_prefix_ + ".txt";
  result->save(trace);
  std::ofstream out(table);
  out << FormatOperatorTable(SelfTimes(EventsOf(*result)), int(std::max<int64_t>(1, profiled_)));
  if (!out) throw std::runtime_error("cannot write " + table);
  LogInfo("profile of steps written: " + table + " (operators by self time), " + trace + " (Chrome trace)");
}

}  // namespace trainyard
