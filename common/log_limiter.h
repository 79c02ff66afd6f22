// Log lines that peers can make us write, written at a rate we choose.
//
// A key holder sending refused messages as fast as it can would otherwise fill the
// daemon's log (8 MB/s was measured). Per kind of line, the first `burst` lines of each
// `window_s` are written; the others are only counted, and the next line written of that
// kind says how many were left out. Counters kept elsewhere (refused_messages(), the
// metrics) still count every one. Not thread-safe: one per thread that logs.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace trainyard {

class LogLimiter {
 public:
  explicit LogLimiter(int burst = 5, double window_s = 10) : burst_(burst), window_s_(window_s) {}

  // Whether a line of `kind` (a fixed string of the caller's, never a peer's bytes) may
  // be written at `now_s` (any steady clock, in seconds).
  // When it may, `*left_out` is the number of lines of that kind not written since the
  // last one that was.
  bool Allow(const std::string& kind, double now_s, int64_t* left_out);

 private:
  struct Window {
    double start = -1e300;
    int written = 0;
    int64_t left_out = 0;
  };
  int burst_;
  double window_s_;
  std::map<std::string, Window> windows_;
};

// " (N more like it not logged)" when N > 0, else "".
std::string LeftOutNote(int64_t left_out);

}  // namespace trainyard
