// StepTimer on the CPU: parts in order, and parts marked once per micro-batch summed.
// (tests/gpu/device_pipeline_test.cc reads device time on CUDA.)
#include "worker/train/step_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace trainyard {
namespace {

void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(StepTimer, PartsMarkedAgainInAStepAreSummed) {
  StepTimer timer(torch::kCPU, 3);
  timer.Begin();
  Sleep(10);
  timer.Mark();  // part 0
  for (int micro = 0; micro < 3; ++micro) {
    Sleep(10);
    timer.Mark(1);
  }
  timer.Mark(2);
  timer.Begin();  // the next step, left open
  timer.Mark();
  const auto steps = timer.Collect();
  ASSERT_EQ(steps.size(), 1u);  // the open step stays pending
  EXPECT_GE(steps[0][0], 10.0);
  EXPECT_GE(steps[0][1], 30.0);  // three intervals
  EXPECT_LT(steps[0][2], steps[0][1]);
  timer.Mark(2);
  EXPECT_EQ(timer.Collect().size(), 1u);
}

TEST(StepTimer, MarksOutsideAStepAndOverlappingStepsAreErrors) {
  StepTimer timer(torch::kCPU, 2);
  EXPECT_THROW(timer.Mark(), std::logic_error);
  timer.Begin();
  EXPECT_THROW(timer.Mark(2), std::logic_error);
  EXPECT_THROW(timer.Begin(), std::logic_error);
  timer.Mark();
  timer.Mark();
  EXPECT_THROW(timer.Mark(), std::logic_error);  // whole: its last part is marked
}

}  // namespace
}  // namespace trainyard
