#include "common/log_limiter.h"

namespace trainyard {

bool LogLimiter::Allow(const std::string& kind, double now_s, int64_t* left_out) {
  Window& w = windows_[kind];
  if (now_s - w.start >= window_s_) {
    w.start = now_s;
    w.written = 0;
  }
  if (w.written >= burst_) {
    ++w.left_out;
    return false;
  }
  ++w.written;
  *left_out = w.left_out;
  w.left_out = 0;
  return true;
}

std::string LeftOutNote(int64_t left_out) {
  return left_out > 0 ? " (" + std::to_string(left_out) + " more like it not logged)" : "";
}

}  // namespace trainyard
