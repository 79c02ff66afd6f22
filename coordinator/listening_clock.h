// The coordinator's listening clock: the time it was able to hear its peers.
//
// Note [Listening time]
// Silence is measured in time the coordinator was able to listen, not in wall time. A
// coordinator that was stopped (SIGSTOP, a swapped-out host, a long stall) has not
// heard the heartbeats sent meanwhile; blaming the workers for that would fail healthy
// jobs the moment it resumes. So each wake of the loop advances the listening clock by
// the time since the last wake, capped at one poll period (max(heartbeat, 0.5 s)), and
// rank liveness and the start/re-adoption grace are read on that clock. A wake after a
// longer stall also starts every rank's liveness window and every attempt's start grace
// afresh: the agents' messages queued during the stall, or their re-registrations, come
// in within it (the agents heartbeat on while they wait to reconnect).
#pragma once

#include <algorithm>

namespace trainyard {

class ListeningClock {
 public:
  // Starts at 0 listened seconds, `now` being the wall time of the first wake and
  // `max_step_s` the most one wake may add.
  void Start(double now, double max_step_s) {
    last_wake_ = now;
    max_step_s_ = max_step_s;
  }
  // A wake of the loop at wall time `now`: adds the time since the last wake, at most
  // one step. Returns how long the loop had stalled: the time since the last wake if it
  // was longer than a step, else 0.
  double Advance(double now) {
    const double step = now - last_wake_;
    listened_ += std::clamp(step, 0.0, max_step_s_);
    last_wake_ = now;
    return step > max_step_s_ ? step : 0;
  }
  // Seconds listened since the start.
  double Now() const { return listened_; }

 private:
  double listened_ = 0, last_wake_ = 0, max_step_s_ = 1;
};

}  // namespace trainyard
