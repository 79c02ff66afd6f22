// The clock every component times itself with (monotonic), and elapsed-time helpers.
#pragma once

#include <chrono>

namespace trainyard {

using Clock = std::chrono::steady_clock;

inline double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Now on Clock, in seconds from its arbitrary epoch: for intervals only.
inline double SteadySeconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

}  // namespace trainyard
