#include "worker/train/step_timer.h"

#include <chrono>
#include <stdexcept>

#include "common/clock.h"

#ifdef TRAINYARD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainyard {
namespace {

double NowMs() { return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count(); }

}  // namespace

#ifdef TRAINYARD_WITH_CUDA
struct StepTimer::DeviceMarks {
  using Step = std::vector<std::unique_ptr<at::cuda::CUDAEvent>>;
  std::deque<Step> pending;  // steps opened since the last Collect()
  std::vector<Step> spare;   // collected steps whose events can be recorded again
  size_t used = 0;           // events of pending.back() recorded so far

  Step TakeStep() {
    if (spare.empty()) return {};
    Step step = std::move(spare.back());
    spare.pop_back();
    return step;
  }
  // The newest step's next event, made when the step has more marks than any before.
  at::cuda::CUDAEvent& NextEvent() {
    Step& step = pending.back();
    if (used == step.size()) step.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    return *step[used++];
  }
};
#else
struct StepTimer::DeviceMarks {};
#endif

StepTimer::StepTimer(torch::Device device, int parts) : device_(device), parts_(parts) {
#ifdef TRAINYARD_WITH_CUDA
  if (device_.is_cuda()) device_marks_ = std::make_unique<DeviceMarks>();
#endif
}

StepTimer::~StepTimer() = default;

void StepTimer::Begin() {
  if (StepIsOpen()) throw std::logic_error("StepTimer: a step was opened before the previous one got all its marks");
  open_ = true;
  step_parts_.emplace_back();
#ifdef TRAINYARD_WITH_CUDA
  if (device_marks_) {
    device_marks_->pending.push_back(device_marks_->TakeStep());
    device_marks_->used = 0;
    device_marks_->NextEvent().record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return;
  }
#endif
  host_steps_.emplace_back(1, NowMs());
}

void StepTimer::Mark() { Mark(step_parts_.empty() || step_parts_.back().empty() ? 0 : step_parts_.back().back() + 1); }

void StepTimer::Mark(int part) {
  if (!StepIsOpen() || part < 0 || part >= parts_)
    throw std::logic_error("StepTimer: a mark outside an open step, or of a part the step does not have");
  step_parts_.back().push_back(part);
  open_ = part != parts_ - 1;
#ifdef TRAINYARD_WITH_CUDA
  if (device_marks_) {
    device_marks_->NextEvent().record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return;
  }
#endif
  host_steps_.back().push_back(NowMs());
}

std::vector<double> StepTimer::PartSums(const std::vector<double>& times, const std::vector<int>& parts) const {
  std::vector<double> ms(parts_, 0.0);
  for (size_t i = 0; i < parts.size(); ++i) ms[parts[i]] += times[i + 1] - times[i];
  return ms;
}

std::vector<std::vector<double>> StepTimer::Collect() {
  std::vector<std::vector<double>> out;
  const size_t whole = step_parts_.size() - (StepIsOpen() ? 1 : 0);  // an open step stays pending
#ifdef TRAINYARD_WITH_CUDA
  if (device_marks_) {
    auto& pending = device_marks_->pending;
    if (whole == 0) return out;
    pending[whole - 1][step_parts_[whole - 1].size()]->synchronize();
    for (size_t s = 0; s < whole; ++s) {
      const auto& events = pending.front();
      std::vector<double> times(step_parts_.front().size() + 1, 0.0);
      for (size_t i = 1; i < times.size(); ++i) times[i] = times[i - 1] + events[i - 1]->elapsed_time(*events[i]);
      out.push_back(PartSums(times, step_parts_.front()));
      device_marks_->spare.push_back(std::move(pending.front()));
      pending.pop_front();
      step_parts_.pop_front();
    }
    return out;
  }
#endif
  for (size_t s = 0; s < whole; ++s) {
    out.push_back(PartSums(host_steps_.front(), step_parts_.front()));
    host_steps_.pop_front();
    step_parts_.pop_front();
  }
  return out;
}

}  // namespace trainyard
