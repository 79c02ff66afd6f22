// Times the parts of training steps without making the host wait for the device.
//
// A step is a sequence of marks: Begin() opens it and each Mark() closes the next
// part. Under gradient accumulation a step runs some parts once per micro-batch:
// Mark(part) closes an interval that counts to `part`, and a part's time is the sum of
// its intervals. The step is whole once its last part is marked. On CPU a mark is a host timestamp (the work before it
// has finished, since CPU kernels run synchronously). On CUDA a mark is an event recorded on the current stream, so a
// part's time is the device time between two marks and nothing in the step blocks the host; the events are read by
// Collect(), which waits once, for the newest event, and turns every step opened since the previous Collect() into
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
  // Closes the next part of the open step (the one after the last marked).
  void Mark();
  // Closes an interval of the open step that counts to `part`, which may have been
  // marked before in this step. REQUIRES: 0 <= part < parts().
  void Mark(int part);
  // Milliseconds of each part (parts() values) of every step opened since the last
  // call, oldest first. On CUDA this waits for the newest mark to be reached.
  std::vector<std::vector<double>> Collect();

  int parts() const { return parts_; }

 private:
  struct DeviceMarks;  // CUDA events, reused across steps

  bool StepIsOpen() const { return open_; }
  // Milliseconds per part from one step's mark times and their parts.
  std::vector<double> PartSums(const std::vector<double>& times, const std::vector<int>& parts) const;

  torch::Device device_;
  int parts_;
  bool open_ = false;
  std::deque<std::vector<int>> step_parts_;     // per step: the part each mark after the first closes
  std::deque<std::vector<double>> host_steps_;  // CPU: timestamps (ms) per step
  std::unique_ptr<DeviceMarks> device_marks_;
};

}  // namespace trainyard
