#include "coordinator/scheduler.h"

#include <algorithm>
#include <limits>
#include <set>

namespace trainyard {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

struct World {
  std::string device;
  std::vector<int> free;                     // sorted
  std::vector<std::pair<double, int>> ends;  // (estimated end, ranks freed) of running jobs
  int total = 0;
};

bool Matches(const QueuedJob& job, const World& world) { return job.device == "any" || job.device == world.device; }

std::map<std::string, World> Worlds(const std::vector<WorkerRank>& ranks, double now) {
  std::map<std::string, World> worlds;
  std::map<std::string, std::map<std::string, std::pair<double, int>>> running;  // world -> job -> (end, count)
  for (const auto& r : ranks) {
    World& w = worlds[r.world];
    w.device = r.device;
    ++w.total;
    if (r.job.empty()) {
      w.free.push_back(r.rank);
    } else {
      auto& entry = running[r.world][r.job];
      entry.first = r.estimated_end > 0 ? std::max(r.estimated_end, now) : kNever;
      ++entry.second;
    }
  }
  for (auto& [name, w] : worlds) {
    std::sort(w.free.begin(), w.free.end());
    for (const auto& [job, end_count] : running[name]) w.ends.push_back(end_count);
    std::sort(w.ends.begin(), w.ends.end());
  }
  return worlds;
}

// When `needed` ranks will be free in `w`, by the running jobs' estimated ends.
double ShadowTime(const World& w, int needed, double now) {
  int available = static_cast<int>(w.free.size());
  if (available >= needed) return now;
  for (const auto& [end, count] : w.ends) {
    available += count;
    if (available >= needed) return end;
  }
  return kNever;
}

Placement Take(const QueuedJob& job, const std::string& name, World& w, bool backfilled) {
  Placement p{job.id, name, std::vector<int>(w.free.begin(), w.free.begin() + job.ranks), backfilled};
  w.free.erase(w.free.begin(), w.free.begin() + job.ranks);
  return p;
}

}  // namespace

ScheduleResult Scheduler::Schedule(std::vector<QueuedJob> queue, const std::vector<WorkerRank>& ranks,
                                   double now) const {
  std::stable_sort(queue.begin(), queue.end(), [](const QueuedJob& a, const QueuedJob& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.order < b.order;
  });
  std::map<std::string, World> worlds = Worlds(ranks, now);
  ScheduleResult result;
  for (const QueuedJob& job : queue) {
    bool fits_somewhere = false;
    for (const auto& [name, w] : worlds) fits_somewhere = fits_somewhere || (Matches(job, w) && w.total >= job.ranks);
    if (!fits_somewhere) {
      result.unplaceable.push_back(job.id);
      continue;
    }
    if (!result.reservation) {
      // Still in strict order: start the job if a world has room, else it becomes the head.
      auto it = std::find_if(worlds.begin(), worlds.end(), [&](const auto& item) {
        return Matches(job, item.second) && static_cast<int>(item.second.free.size()) >= job.ranks;
      });
      if (it != worlds.end()) {
        result.start.push_back(Take(job, it->first, it->second, false));
        continue;
      }
      Reservation best{job.id, "", kNever};
      for (const auto& [name, w] : worlds)
        if (Matches(job, w) && w.total >= job.ranks) {
          const double t = ShadowTime(w, job.ranks, now);
          if (best.world.empty() || t < best.start) best = {job.id, name, t};
        }
      result.reservation = best;
      continue;
    }
    // Backfill behind the head's reservation.
    const Reservation& head = *result.reservation;
    const int head_ranks =
        std::find_if(queue.begin(), queue.end(), [&](const QueuedJob& q) { return q.id == head.job; })->ranks;
    for (auto& [name, w] : worlds) {
      if (!Matches(job, w) || static_cast<int>(w.free.size()) < job.ranks) continue;
      const bool ends_in_time = job.estimate > 0 && now + job.estimate <= head.start;
      // Ranks the head will have at its start if this job is still running then.
      const bool leaves_room = name != head.world || ShadowTime(w, head_ranks + job.ranks, now) <= head.start;
      if (name != head.world || ends_in_time || leaves_room) {
        result.start.push_back(Take(job, name, w, true));
        break;
      }
    }
  }
  return result;
}

}  // namespace trainyard
