#include "coordinator/decayed_usage.h"

#include <algorithm>
#include <cmath>

namespace trainyard {

double DecayedUsage::Of(double ranks, double from, double to, double now, double half_life_s) {
  if (to <= from) return 0;
  if (half_life_s <= 0) return ranks * (to - from);
  const double rate = std::log(2.0) / half_life_s;
  return ranks * (std::exp(-rate * std::max(0.0, now - to)) - std::exp(-rate * std::max(0.0, now - from))) / rate;
}

double DecayedUsage::Decay(double seconds) const {
  return half_life_s_ > 0 ? std::exp(-std::log(2.0) / half_life_s_ * seconds) : 1.0;
}

void DecayedUsage::AddEnded(const std::string& user, double ranks, double from, double to) {
  if (to <= from) return;
  Total& total = totals_[user];
  // Taken at the later of its moment and this interval's end, where both figures are exact.
  const double at = std::max(total.as_of, to);
  total.value = total.value * Decay(at - total.as_of) + Of(ranks, from, to, at, half_life_s_);
  total.as_of = at;
}

void DecayedUsage::AddTotal(const std::string& user, double value, double as_of) {
  Total& total = totals_[user];
  const double at = std::max(total.as_of, as_of);
  total.value = total.value * Decay(at - total.as_of) + value * Decay(at - as_of);
  total.as_of = at;
}

std::map<std::string, double> DecayedUsage::At(double now) const {
  std::map<std::string, double> out;
  // A clock that went back reads the figures at their own moment.
  for (const auto& [user, total] : totals_) out[user] = total.value * Decay(std::max(0.0, now - total.as_of));
  return out;
}

}  // namespace trainyard
