// The schedule's shape; its values against transformers' schedulers, at every step, are
// tests/reference/schedule_parity.py's.
#include "worker/train/lr_schedule.h"

#include <gtest/gtest.h>

namespace trainyard {
namespace {

TEST(LrSchedule, WarmUpStartsAtZeroAndLastsTheCeilingOfTheRatio) {
  const LrSchedule linear(ScheduleKind::kLinear, 1.0, 0.07, 100);
  EXPECT_EQ(linear.warmup_steps(), 8);  // ceil(100 * 0.07) in doubles: 7.000000000000001
  EXPECT_EQ(linear.At(0), 0.0);
  EXPECT_EQ(linear.At(1), 0.125);
  EXPECT_EQ(linear.At(8), 1.0);
  EXPECT_EQ(LrSchedule(ScheduleKind::kLinear, 1.0, 0.1, 30).warmup_steps(), 3);
  EXPECT_EQ(LrSchedule(ScheduleKind::kLinear, 1.0, 0.0, 30).At(0), 1.0);  // no warm-up
}

TEST(LrSchedule, LinearAndCosineFallToZeroAndConstantStays) {
  const LrSchedule linear(ScheduleKind::kLinear, 2.0, 0.0, 10), cosine(ScheduleKind::kCosine, 2.0, 0.0, 10),
      constant(ScheduleKind::kConstant, 2.0, 0.0, 10);
  EXPECT_EQ(linear.At(5), 1.0);
  EXPECT_NEAR(cosine.At(5), 1.0, 1e-15);  // half way: cos(pi / 2) = 0
  EXPECT_EQ(cosine.At(0), 2.0);
  for (int64_t step = 0; step < 10; ++step) {
    EXPECT_EQ(constant.At(step), 2.0);
    EXPECT_LE(cosine.At(step + 1), cosine.At(step));
  }
  EXPECT_EQ(linear.At(10), 0.0);
  EXPECT_EQ(linear.At(12), 0.0);  // past the end: 0, never negative
}

}  // namespace
}  // namespace trainyard
