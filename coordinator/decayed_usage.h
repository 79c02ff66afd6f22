// Note [Fair share]'s decayed usage as a running total per user, so that a scheduling
// pass costs the same after a month of history as after a day.
//
// An interval of `ranks` ranks from t0 to t1 counts, at a moment T >= t1,
// ranks x (e^(-l(T-t1)) - e^(-l(T-t0))) / l with l = ln 2 / H (H the half-life). Every
// term of a sum of such figures decays by the same e^(-l dT) as T moves on, so a user's
// ended intervals are one number and the moment it is taken at: moving it is one
// multiplication, adding an interval that has just ended is one addition. Only the open
// intervals (the attempts running now) are computed afresh at each pass.
#pragma once

#include <map>
#include <string>

namespace trainyard {

class DecayedUsage {
 public:
  // A half-life of 0 (or less) does not decay: figures are plain rank-seconds.
  explicit DecayedUsage(double half_life_s) : half_life_s_(half_life_s) {}

  double half_life_s() const { return half_life_s_; }
  // Adds `user`'s interval of `ranks` ranks from `from` to `to`; nothing if to <= from.
  void AddEnded(const std::string& user, double ranks, double from, double to);
  // Adds a figure already decayed to the moment `as_of` (a total folded from intervals
  // whose rows are gone: Note [History retention] in coordinator/state_store.h).
  void AddTotal(const std::string& user, double value, double as_of);
  // Each user's decayed rank-seconds at `now`, of the intervals added. Exact (to
  // rounding) for `now` at or after the end of each of them.
  std::map<std::string, double> At(double now) const;

  // The closed form above: one interval's decayed rank-seconds at `now` (an interval
  // still open ends at now).
  static double Of(double ranks, double from, double to, double now, double half_life_s);

 private:
  struct Total {
    double value = 0;  // decayed rank-seconds at `as_of`
    double as_of = 0;
  };
  double Decay(double seconds) const;  // the factor by which `seconds` of time shrink a total

  double half_life_s_;
  std::map<std::string, Total> totals_;
};

}  // namespace trainyard
