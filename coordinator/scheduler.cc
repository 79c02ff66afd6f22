#include "coordinator/scheduler.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <unordered_set>

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
  std::vector<std::pair<std::string, size_t>> hosts;  // (host, free slots), in name order
  hosts.reserve(p.free.size());
  for (const auto& [host, list] : p.free) hosts.emplace_back(host, list.size());
  std::stable_sort(hosts.begin(), hosts.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  Placement placement{job.id, {}, backfilled};
  for (const auto& [host, count] : hosts) {
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

std::string SlotsText(int ranks, const std::string& device) {
  return std::to_string(ranks) + " " + (device == "any" ? "" : device + " ") + (ranks == 1 ? "slot" : "slots");
}

std::string WhenText(double start, double now) {
  if (start == kNever) return "when is unknown (a running job has no estimate)";
  const int seconds = static_cast<int>(std::max(0.0, start - now));
  return "expected in " + (seconds < 120 ? std::to_string(seconds) + " s" : std::to_string(seconds / 60) + " min");
}

// One call of Schedule: the pools as they fill, and what each user runs.
class Pass {
 public:
  Pass(const std::vector<const QueuedJob*>& queue, const std::vector<WorkerRank>& slots, double now,
       const std::vector<RunningJob>& running, const SchedulerPolicy& policy)
      : queue_(queue), now_(now), policy_(policy), pools_(Pools(slots, now)) {
    result_.waiting.reserve(queue.size());
    for (const RunningJob& r : running) {
      running_[r.id] = r;
      if (r.preemptible) lowest_preemptible_ = std::min(lowest_preemptible_, r.priority);
    }
    for (const WorkerRank& slot : slots) {
      if (slot.job.empty()) continue;
      ++job_slots_[slot.job];
      job_device_[slot.job] = slot.device;
      auto it = running_.find(slot.job);
      if (it != running_.end()) ++user_ranks_[it->second.user];
    }
  }

  ScheduleResult Run() {
    for (const QueuedJob* job : queue_) Consider(*job);
    return std::move(result_);
  }

 private:
  void Consider(const QueuedJob& job) {
    if (!FitsSomewhere(job)) {
      result_.unplaceable.push_back(job.id);
      result_.waiting[job.id] =
          "Unplaceable: the pool has fewer than " + SlotsText(job.ranks, job.device) + " of one device kind";
      return;
    }
    if (policy_.user_max_ranks > 0 && user_ranks_[job.user] + job.ranks > policy_.user_max_ranks) {
      result_.waiting[job.id] = "QuotaRanks: " + (job.user.empty() ? std::string("its user") : job.user) + " runs " +
                                std::to_string(user_ranks_[job.user]) + " ranks and this job needs " +
                                std::to_string(job.ranks) + " (--user-max-ranks " +
                                std::to_string(policy_.user_max_ranks) + ")";
      return;
    }
    if (!result_.reservation) return ConsiderInOrder(job);
    ConsiderBackfill(job);
  }

  bool FitsSomewhere(const QueuedJob& job) const {
    for (const auto& [device, p] : pools_)
      if (Matches(job, device) && p.total >= job.ranks) return true;
    return false;
  }

  void Start(const QueuedJob& job, Pool& pool, bool backfilled) {
    result_.start.push_back(Take(job, pool, backfilled));
    user_ranks_[job.user] += job.ranks;
  }

  // Still in strict order: start the job if a pool has room, else it becomes the head.
  void ConsiderInOrder(const QueuedJob& job) {
    auto it = std::find_if(pools_.begin(), pools_.end(), [&](const auto& item) {
      return Matches(job, item.first) && static_cast<int>(item.second.free_count) >= job.ranks;
    });
    if (it != pools_.end()) return Start(job, it->second, false);
    Reservation best{job.id, "", kNever};
    int free = 0;
    for (const auto& [device, p] : pools_)
      if (Matches(job, device) && p.total >= job.ranks) {
        const double t = ShadowTime(p, job.ranks, now_);
        if (best.device.empty() || t < best.start) {
          best = {job.id, device, t};
          free = static_cast<int>(p.free_count);
        }
      }
    result_.reservation = best;
    head_ = job;
    result_.waiting[job.id] = "Resources: needs " + SlotsText(job.ranks, job.device) + ", " + std::to_string(free) +
                              " free; first in line, " + WhenText(best.start, now_);
    if (policy_.preemption) Preempt(job);
  }

  // What rule 5 finds for one job on one device kind: the running jobs it would stop,
  // the stopping ones it counts as freed for it, and whether that is enough.
  struct Room {
    std::string device;
    std::vector<std::string> victims, stopping;
    bool enough = false;
  };

  // `with_free`: the pool's free slots count too (the head's; a later job's are not its
  // own). The stopping jobs that count for `job`: those stopping for it, then, as far as
  // it needs them, those that no other job counted in this pass of lower priority
  // stopping for no job still queued, and the slots of ended jobs whose ranks have not
  // reported them ended yet.
  Room RoomOn(const QueuedJob& job, const std::string& device, const Pool& p, bool with_free) {
    Room room{device, {}, {}, false};
    int available = with_free ? static_cast<int>(p.free_count) : 0;
    std::vector<const RunningJob*> candidates;
    std::vector<std::string> unclaimed;
    for (const auto& [id, count] : job_slots_) {
      if (job_device_[id] != device) continue;
      auto it = running_.find(id);
      if (it == running_.end()) {  // its attempt has ended: its slots free as its ranks report it
        if (!counted_stopping_.count(id)) unclaimed.push_back(id);
        continue;
      }
      const RunningJob& r = it->second;
      if (r.stopping && r.stopping_for == job.id) {
        available += count;
        room.stopping.push_back(id);
      } else if (r.stopping) {
        if (r.priority < job.priority && !counted_stopping_.count(id) && !IsQueued(r.stopping_for))
          unclaimed.push_back(id);
      } else if (r.preemptible && r.priority < job.priority) {
        candidates.push_back(&r);
      }
    }
    for (size_t i = 0; i < unclaimed.size() && available < job.ranks; ++i) {
      available += job_slots_[unclaimed[i]];
      room.stopping.push_back(unclaimed[i]);
    }
    if (available < job.ranks) room.victims = Victims(std::move(candidates), job.ranks - available);
    for (const std::string& id : room.victims) available += job_slots_[id];
    room.enough = available >= job.ranks;
    return room;
  }

  // Only preemption asks, and only of jobs stopping for another: the set is made then.
  bool IsQueued(const std::string& id) {
    if (!queued_ids_) {
      queued_ids_.emplace();
      for (const QueuedJob* job : queue_) queued_ids_->insert(job->id);
    }
    return queued_ids_->count(id) > 0;
  }

  // Of the device kinds `job` may run on, one where enough is stopping for it already,
  // else the one needing the fewest victims (the first by name of those).
  std::optional<Room> BestRoom(const QueuedJob& job, bool with_free) {
    std::optional<Room> best;
    for (const auto& [device, p] : pools_) {
      if (!Matches(job, device) || p.total < job.ranks) continue;
      Room room = RoomOn(job, device, p, with_free);
      if (!room.enough) continue;
      if (room.victims.empty()) return room;
      if (!best || room.victims.size() < best->victims.size()) best = std::move(room);
    }
    return best;
  }

  // Marks the room's jobs as stopping for `job`, the new victims to be told, and says why
  // the job waits.
  void Claim(const QueuedJob& job, const Room& room) {
    counted_stopping_.insert(room.stopping.begin(), room.stopping.end());
    if (room.victims.empty()) {
      result_.waiting[job.id] = "Preempting: waiting for preempted jobs to stop and free their slots";
      return;
    }
    std::string names;
    for (const std::string& id : room.victims) {
      running_[id].stopping = true;
      running_[id].stopping_for = job.id;
      counted_stopping_.insert(id);
      result_.preempt.push_back(id);
      result_.preempt_for.push_back(job.id);
      names += (names.empty() ? "job " : ", job ") + id;
    }
    result_.waiting[job.id] = "Preempting: stopping " + names + " (lower priority) to make room";
  }

  // Rule 5 for the head.
  void Preempt(const QueuedJob& head) {
    const std::optional<Room> room = BestRoom(head, true);
    if (!room) return NameHolders(head);
    // The head starts as soon as its victims stop: no backfill may take the free slots
    // it counts on (rule 4, with the reservation at now on that kind, lets none in).
    result_.reservation->device = room->device;
    result_.reservation->start = now_;
    Claim(head, *room);
  }

  // Rule 5 for a job behind the head that fits nowhere now; whether it makes room.
  bool PreemptBehindHead(const QueuedJob& job) {
    if (!policy_.preemption || job.priority <= lowest_preemptible_ || tries_behind_head_ >= kMaxPreemptingPerPass)
      return false;
    ++tries_behind_head_;
    const std::optional<Room> room = BestRoom(job, false);
    if (!room) return false;
    Claim(job, *room);
    return true;
  }

  // A head that preemption cannot help: names the lower-priority jobs it may not preempt
  // (preemptible: false) that hold slots of a kind it could run on, so that its reason
  // says who holds the pool.
  void NameHolders(const QueuedJob& head) {
    std::string names;
    for (const auto& [id, count] : job_slots_) {
      auto it = running_.find(id);
      if (it == running_.end() || it->second.preemptible || it->second.priority >= head.priority) continue;
      if (!Matches(head, job_device_[id])) continue;
      names += (names.empty() ? "job " : ", job ") + id + " (" + std::to_string(count) + " slots, priority " +
               std::to_string(it->second.priority) + ")";
    }
    if (!names.empty()) result_.waiting[head.id] += "; not preemptible: " + names;
  }

  // Rule 5's choice within one device kind: the largest candidates until one more
  // suffices, and of those that suffice the lowest priority, then the smallest, then the
  // most recently started. As few jobs as any choice, sparing large jobs where a small
  // one makes room. Empty if all of them together free fewer than `needed` slots.
  std::vector<std::string> Victims(std::vector<const RunningJob*> candidates, int needed) {
    std::vector<std::string> victims;
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](const RunningJob* a, const RunningJob* b) { return job_slots_[a->id] > job_slots_[b->id]; });
    while (needed > 0 && !candidates.empty()) {
      const RunningJob* last = nullptr;
      for (const RunningJob* c : candidates) {
        if (job_slots_[c->id] < needed) continue;
        if (!last || c->priority < last->priority ||
            (c->priority == last->priority &&
             (job_slots_[c->id] < job_slots_[last->id] ||
              (job_slots_[c->id] == job_slots_[last->id] && c->started > last->started))))
          last = c;
      }
      const RunningJob* pick = last ? last : candidates.front();
      victims.push_back(pick->id);
      needed -= job_slots_[pick->id];
      candidates.erase(std::find(candidates.begin(), candidates.end(), pick));
    }
    if (needed > 0) victims.clear();
    return victims;
  }

  // Backfill behind the head's reservation.
  void ConsiderBackfill(const QueuedJob& job) {
    const Reservation& head = *result_.reservation;
    bool fits_now = false;
    for (auto& [device, p] : pools_) {
      if (!Matches(job, device) || static_cast<int>(p.free_count) < job.ranks) continue;
      fits_now = true;
      const bool ends_in_time = job.estimate > 0 && now_ + job.estimate <= head.start;
      // Slots the head will have at its start if this job is still running then.
      const bool leaves_room = device != head.device || ShadowTime(p, head_.ranks + job.ranks, now_) <= head.start;
      if (ends_in_time || leaves_room) return Start(job, p, true);
    }
    if (!fits_now && PreemptBehindHead(job)) return;
    result_.waiting[job.id] = WhyBehindHead(job, fits_now);
  }

  std::string WhyBehindHead(const QueuedJob& job, bool fits_now) const {
    const std::string head = "job " + head_.id;
    if (head_.priority > job.priority)
      return "Priority: behind " + head + " (priority " + std::to_string(head_.priority) + "), which is first in line";
    if (head_.user != job.user && head_.usage < job.usage)
      return "FairShare: behind " + head + " of " + head_.user + ", whose recent usage is lower than " +
             (job.user.empty() ? std::string("its user's") : job.user + "'s");
    if (fits_now)
      return "Reservation: it fits now but would delay " + head +
             ", which is first in line (give the job "
             "resources.estimate_minutes to let it backfill)";
    return "Resources: needs " + SlotsText(job.ranks, job.device) + "; behind " + head + ", which was submitted first";
  }

  const std::vector<const QueuedJob*>& queue_;
  const double now_;
  const SchedulerPolicy& policy_;
  std::map<std::string, Pool> pools_;
  std::map<std::string, RunningJob> running_;
  std::map<std::string, int> job_slots_;                       // running job -> slots it holds
  std::map<std::string, std::string> job_device_;              // running job -> its device kind
  std::map<std::string, int> user_ranks_;                      // user -> ranks running (and started in this pass)
  std::optional<std::unordered_set<std::string>> queued_ids_;  // IsQueued's
  std::set<std::string> counted_stopping_;  // stopping jobs a job has counted as freed for it in this pass
  int lowest_preemptible_ = std::numeric_limits<int>::max();  // of the running jobs, stopping or not
  int tries_behind_head_ = 0;
  QueuedJob head_;
  ScheduleResult result_;
};

}  // namespace

ScheduleResult Scheduler::Schedule(const std::vector<QueuedJob>& queue, const std::vector<WorkerRank>& slots,
                                   double now, const std::vector<RunningJob>& running,
                                   const SchedulerPolicy& policy) const {
  std::vector<const QueuedJob*> order;  // rule 1; pointers, so that sorting moves no strings
  order.reserve(queue.size());
  for (const QueuedJob& job : queue) order.push_back(&job);
  std::stable_sort(order.begin(), order.end(), [](const QueuedJob* a, const QueuedJob* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->usage != b->usage) return a->usage < b->usage;
    return a->order < b->order;
  });
  return Pass(order, slots, now, running, policy).Run();
}

}  // namespace trainyard
