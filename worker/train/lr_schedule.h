// The learning rate at each optimizer step: train.lr_schedule (linear, cosine or
// constant) after a linear warm-up over the first train.warmup_ratio of the steps.
//
// The values are those of transformers' get_linear_schedule_with_warmup,
// get_cosine_schedule_with_warmup (half a cycle) and get_constant_schedule_with_warmup
// under HF Trainer, to the bit: the warm-up has ceil(total_steps * warmup_ratio) steps,
// the rate at optimizer step k (0-based: the steps taken before it) is peak * f(k), and
// f rises from 0 at k = 0. So a run with a warm-up takes its first step at lr 0, as HF
// Trainer's does (tests/reference/schedule_parity.py).
#pragma once

#include <cstdint>

#include "common/spec/job_spec.h"

namespace trainyard {

class LrSchedule {
 public:
  LrSchedule(ScheduleKind kind, double peak, double warmup_ratio, int64_t total_steps);

  // The rate of optimizer step `step` (0-based).
  double At(int64_t step) const;
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  double Factor(int64_t step) const;

  ScheduleKind kind_;
  double peak_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

}  // namespace trainyard
