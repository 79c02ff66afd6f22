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

  Step TakeStep(int marks) {
    if (!spare.empty()) {
      Step step = std::move(spare.back());
      spare.pop_back();
      return step;
    }
    Step step;
    for (int i = 0; i < marks; ++i) step.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    return step;
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
  marks_in_step_ = 0;
#ifdef TRAINYARD_WITH_CUDA
  if (device_marks_) {
    device_marks_->pending.push_back(device_marks_->TakeStep(parts_ + 1));
    Mark();
    return;
  }
#endif
  host_steps_.emplace_back();
  Mark();
}

void StepTimer::Mark() {
  if (marks_in_step_ > parts_) throw std::logic_error("StepTimer: more marks than parts in a step");
#ifdef TRAINYARD_WITH_CUDA
  if (device_marks_) {
    device_marks_->pending.back()[marks_in_step_++]->record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return;
  }
#endif
  host_steps_.back().push_back(NowMs());
  ++marks_in_step_;
}

std::vector<std::vector<double>> StepTimer::Collect() {
  std::vector<std::vector<double>> out;
#ifdef TRAINYARD_WITH_CUDA
  if (device_marks_) {
    auto& pending = device_marks_->pending;
    const size_t whole = pending.size() - (StepIsOpen() ? 1 : 0);  // an open step stays pending
    if (whole == 0) return out;
    pending[whole - 1].back()->synchronize();
    for (size_t s = 0; s < whole; ++s) {
      std::vector<double> ms(parts_);
      for (int p = 0; p < parts_; ++p) ms[p] = pending.front()[p]->elapsed_time(*pending.front()[p + 1]);
      out.push_back(std::move(ms));
      device_marks_->spare.push_back(std::move(pending.front()));
      pending.pop_front();
    }
    return out;
  }
#endif
  const size_t whole = host_steps_.size() - (StepIsOpen() ? 1 : 0);
  for (size_t s = 0; s < whole; ++s) {
    const std::vector<double>& t = host_steps_.front();
    std::vector<double> ms(parts_);
    for (int p = 0; p < parts_; ++p) ms[p] = t[p + 1] - t[p];
    out.push_back(std::move(ms));
    host_steps_.pop_front();
  }
  return out;
}

}  // namespace trainyard
