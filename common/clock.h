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

}  // namespace trainyard
