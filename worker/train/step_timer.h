// Times the parts of training steps without making the host wait for the device.
//
// A step is a sequence of marks: Begin() opens it and each Mark() closes the next
// part. On CPU a mark is a host timestamp (the work before it has finished, since CPU
// kernels run synchronously). On CUDA a mark is an event recorded on the current
// stream, so a part's time is the device time between two marks and nothing in the
// step blocks the host; the events are read by Collect(), which waits once, for the
// newest event, and turns every step opened since the previous Collect() into
// milliseconds. The trainer collects once per logging interval and at the end of each
// epoch, so a GPU step never synchronises the device.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <memory>
#include <vector>

namespace trainyard {

class StepTimer {
 public:
  // `parts`: marks per step after Begin().
  StepTimer(torch::Device device, int parts);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  // Opens a step. REQUIRES: the previous step got all its marks.
  void Begin();
  // Closes the next part of the open step.
  void Mark();
  // Milliseconds of each part (parts() values) of every step opened since the last
  // call, oldest first. On CUDA this waits for the newest mark to be reached.
  std::vector<std::vector<double>> Collect();

  int parts() const { return parts_; }

 private:
  struct DeviceMarks;  // CUDA events, reused across steps

  bool StepIsOpen() const { return marks_in_step_ > 0 && marks_in_step_ <= parts_; }

  torch::Device device_;
  int parts_;
  int marks_in_step_ = 0;
  std::deque<std::vector<double>> host_steps_;  // CPU: timestamps (ms) per step
  std::unique_ptr<DeviceMarks> device_marks_;
};

}  // namespace trainyard
