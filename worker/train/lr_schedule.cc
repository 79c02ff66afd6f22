#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainyard {
namespace {

// math.pi's double.
constexpr double kPi = 3.14159265358979323846;

}  // namespace

LrSchedule::LrSchedule(ScheduleKind kind, double peak, double warmup_ratio, int64_t total_steps)
    : kind_(kind),
      peak_(peak),
      // TrainingArguments.get_warmup_steps: math.ceil(num_training_steps * warmup_ratio),
      // in doubles, so 100 steps at 0.07 warm up over 8 (100 * 0.07 is 7.000000000000001).
      warmup_steps_(static_cast<int64_t>(std::ceil(double(total_steps) * warmup_ratio))),
      total_steps_(total_steps) {}

double LrSchedule::At(int64_t step) const { return peak_ * Factor(step); }

// Each expression is written as transformers writes its lambda, operation for
// operation, so that the doubles agree to the last bit.
double LrSchedule::Factor(int64_t step) const {
  if (step < warmup_steps_) return double(step) / double(std::max<int64_t>(1, warmup_steps_));
  const double after_warmup = double(std::max<int64_t>(1, total_steps_ - warmup_steps_));
  switch (kind_) {
    case ScheduleKind::kLinear:
      return std::max(0.0, double(total_steps_ - step) / after_warmup);
    case ScheduleKind::kCosine: {
      const double progress = double(step - warmup_steps_) / after_warmup;
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * 0.5 * 2.0 * progress)));
    }
    case ScheduleKind::kConstant:
      return 1.0;
  }
  return 1.0;
}

}  // namespace trainyard
