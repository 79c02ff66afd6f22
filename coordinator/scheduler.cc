#include "coordinator/scheduler.h"

#include <algorithm>
#include <limits>

namespace trainyard {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// The slots of one device kind.
struct Pool {
  std::map<std::string, std::vector<SlotRef>> free;  // by host, each sorted
  size_t free_count = 0;
  std::vector<std::pair<double, int>> ends;  // (estimated end, slots freed) of running jobs, sorted
  int total = 0;
};

bool Matches(const QueuedJob& job, const std::string& device) { return job.device == "any" || job.device == device; }

std::map<std::string, Pool> Pools(const std::vector<WorkerRank>& slots, double now) {
  std::map<std::string, Pool> pools;
  std::map<std::string, std::map<std::string, std::pair<double, int>>> running;  // device -> job -> (end, count)
  for (const auto& s : slots) {
    Pool& p = pools[s.device];
    ++p.total;
    if (s.job.empty()) {
      p.free[s.host].push_back({s.world, s.rank});
      ++p.free_count;
    } else {
      auto& entry = running[s.device][s.job];
      entry.first = s.estimated_end > 0 ? std::max(s.estimated_end, now) : kNever;
      ++entry.second;
    }
  }
  for (auto& [device, p] : pools) {
    for (auto& [host, list] : p.free) std::sort(list.begin(), list.end());
    for (const auto& [job, end_count] : running[device]) p.ends.push_back(end_count);
    std::sort(p.ends.begin(), p.ends.end());
  }
  return pools;
}

// When `needed` slots will be free in `p`, by the running jobs' estimated ends.
double ShadowTime(const Pool& p, int needed, double now) {
  int available = static_cast<int>(p.free_count);
  if (available >= needed) return now;
  for (const auto& [end, count] : p.ends) {
    available += count;
    if (available >= needed) return end;
  }
  return kNever;
}

// Rule 2: the job's slots, from the hosts with the most free slots first.
Placement Take(const QueuedJob& job, Pool& p, bool backfilled) {
  std::vector<std::string> hosts;
  for (const auto& [host, list] : p.free) hosts.push_back(host);
  std::stable_sort(hosts.begin(), hosts.end(),
                   [&](const std::string& a, const std::string& b) { return p.free[a].size() > p.free[b].size(); });
  Placement placement{job.id, {}, backfilled};
  for (const std::string& host : hosts) {
    std::vector<SlotRef>& list = p.free[host];
    while (!list.empty() && static_cast<int>(placement.slots.size()) < job.ranks) {
      placement.slots.push_back(list.front());
      list.erase(list.begin());
      --p.free_count;
    }
    if (list.empty()) p.free.erase(host);
    if (static_cast<int>(placement.slots.size()) == job.ranks) break;
  }
  return placement;
}

}  // namespace

ScheduleResult Scheduler::Schedule(std::vector<QueuedJob> queue, const std::vector<WorkerRank>& slots,
                                   double now) const {
  std::stable_sort(queue.begin(), queue.end(), [](const QueuedJob& a, const QueuedJob& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.order < b.order;
  });
  std::map<std::string, Pool> pools = Pools(slots, now);
  ScheduleResult result;
  for (const QueuedJob& job : queue) {
    bool fits_somewhere = false;
    for (const auto& [device, p] : pools)
      fits_somewhere = fits_somewhere || (Matches(job, device) && p.total >= job.ranks);
    if (!fits_somewhere) {
      result.unplaceable.push_back(job.id);
      continue;
    }
    if (!result.reservation) {
      // Still in strict order: start the job if a pool has room, else it becomes the head.
      auto it = std::find_if(pools.begin(), pools.end(), [&](const auto& item) {
        return Matches(job, item.first) && static_cast<int>(item.second.free_count) >= job.ranks;
      });
      if (it != pools.end()) {
        result.start.push_back(Take(job, it->second, false));
        continue;
      }
      Reservation best{job.id, "", kNever};
      for (const auto& [device, p] : pools)
        if (Matches(job, device) && p.total >= job.ranks) {
          const double t = ShadowTime(p, job.ranks, now);
          if (best.device.empty() || t < best.start) best = {job.id, device, t};
        }
      result.reservation = best;
      continue;
    }
    // Backfill behind the head's reservation.
    const Reservation& head = *result.reservation;
    const int head_ranks =
        std::find_if(queue.begin(), queue.end(), [&](const QueuedJob& q) { return q.id == head.job; })->ranks;
    for (auto& [device, p] : pools) {
      if (!Matches(job, device) || static_cast<int>(p.free_count) < job.ranks) continue;
      const bool ends_in_time = job.estimate > 0 && now + job.estimate <= head.start;
      // Slots the head will have at its start if this job is still running then.
      const bool leaves_room = device != head.device || ShadowTime(p, head_ranks + job.ranks, now) <= head.start;
      if (ends_in_time || leaves_room) {
        result.start.push_back(Take(job, p, true));
        break;
      }
    }
  }
  return result;
}

}  // namespace trainyard
