// The pool's scheduling pass (Note [Launchers] in launcher.h).
#include "coordinator/pool_launcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <utility>

#include "common/clock.h"
#include "common/metrics.h"

namespace trainyard {

std::string SecondsText(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

void PoolLauncher::Schedule(double now) {
  const Clock::time_point began = Clock::now();
  std::vector<QueuedJob> queue = Queue(now);
  if (sources_.ranks.empty()) return;
  if (!queue.empty()) {
    Place(queue, now);
    sources_.metrics.Observe("trainyard_scheduling_pass_seconds", {}, SecondsSince(began));
  }
  ReplaceLostReplicas(now);
}

void PoolLauncher::ReplaceLostReplicas(double now) {
  std::vector<RunningAttempt*> short_of;
  for (auto& [id, attempt] : sources_.running)
    if (TakesReplacements(attempt)) short_of.push_back(&attempt);
  if (short_of.empty() || QueueWaitsForSlots()) return;
  std::vector<WorkerRank> free;
  for (WorkerRank& slot : Slots())
    if (slot.job.empty()) free.push_back(std::move(slot));
  for (RunningAttempt* attempt : short_of) {
    for (int live = LiveReplicas(*attempt); live < attempt->max_replicas; ++live) {
      const auto slot = SlotForReplica(*attempt, free, now);
      if (slot == free.end()) break;
      sources_.loop.AddReplica(*attempt, {slot->world, slot->rank}, now);
      free.erase(slot);
    }
  }
}

bool PoolLauncher::QueueWaitsForSlots() const {
  for (const auto& [job, reason] : sources_.waiting) {
    const std::string code = reason.substr(0, reason.find(':'));
    if (code == "Resources" || code == "Priority" || code == "FairShare" || code == "Reservation" ||
        code == "Preempting")
      return true;
  }
  return false;
}

std::vector<WorkerRank>::iterator PoolLauncher::SlotForReplica(const RunningAttempt& attempt,
                                                               std::vector<WorkerRank>& free, double now) const {
  std::string device;  // its live replicas'
  std::map<std::string, int> live_on;
  for (const RankKey& slot : attempt.slots) {
    const RankEntry* entry = sources_.ranks.Find(slot);
    if (!entry || attempt.finished.count(slot)) continue;
    device = entry->info.device();
    ++live_on[entry->info.host()];
  }
  auto failures = [&attempt](const WorkerRank& slot) {
    const auto it = attempt.slot_failures.find({slot.world, slot.rank});
    return it == attempt.slot_failures.end() ? RunningAttempt::SlotFailures{} : it->second;
  };
  auto rank = [&](const WorkerRank& slot) {
    return std::make_tuple(failures(slot).count, live_on[slot.host], slot.host, slot.world, slot.rank);
  };
  auto best = free.end();
  for (auto it = free.begin(); it != free.end(); ++it) {
    const RunningAttempt::SlotFailures failed = failures(*it);
    if (!device.empty() && it->device != device) continue;
    if (failed.count > 0 && now - failed.at < ReplacementBackoffS(failed.count)) continue;
    if (best == free.end() || rank(*it) < rank(*best)) best = it;
  }
  return best;
}

void PoolLauncher::Place(const std::vector<QueuedJob>& queue, double now) {
  const SchedulerPolicy policy{policy_.preemption, policy_.user_max_ranks};
  ScheduleResult result = scheduler_.Schedule(queue, Slots(), now, Running(), policy);
  for (auto& backoff : sources_.waiting) result.waiting.insert(std::move(backoff));
  sources_.waiting = std::move(result.waiting);
  StartAttempts(result.start, now);
  for (size_t i = 0; i < result.preempt.size(); ++i)
    sources_.loop.Preempt(std::stoll(result.preempt[i]), result.preempt_for[i]);
  for (const std::string& id : result.unplaceable) {
    const int64_t job = std::stoll(id);
    if (reported_unplaceable_.insert(job).second)
      sources_.store.AddEvent(job, "waiting: " + sources_.waiting.at(id), now);
  }
}

// The queued jobs the scheduler may start now, with their owners' fair-share usage
// (Note [Fair share]); the wait reasons are left holding why the others wait (their backoff).
std::vector<QueuedJob> PoolLauncher::Queue(double now) {
  const std::map<int64_t, JobRecord>& queued = sources_.store.Queued();
  std::vector<QueuedJob> queue;
  sources_.waiting.clear();
  if (queued.empty()) return queue;
  const std::map<std::string, double> usage =
      sources_.store.DecayedRankSeconds(now, policy_.fairshare_half_life_h * 3600.0);
  queue.reserve(queued.size());
  for (const auto& [id, job] : queued) {
    if (job.not_before > now) {
      sources_.waiting[std::to_string(id)] =
          "Backoff: requeued after a failed attempt; eligible again in " + SecondsText(job.not_before - now);
      continue;
    }
    auto used = usage.find(job.user);
    queue.push_back({std::to_string(job.id), job.priority, job.id, job.ranks, job.device, job.estimate_s, job.user,
                     used == usage.end() ? 0.0 : used->second});
  }
  return queue;
}

// The pool's slots. A slot is busy while an attempt awaits its result, and while its
// heartbeats still name a job (one being cancelled, or given up on).
std::vector<WorkerRank> PoolLauncher::Slots() const {
  const std::map<RankKey, const RunningAttempt*> awaiting = sources_.running.AwaitingBySlot();
  std::vector<WorkerRank> slots;
  slots.reserve(sources_.ranks.entries().size());
  for (const auto& [key, entry] : sources_.ranks.entries()) {
    if (!SlurmJobOfWorld(key.first).empty()) continue;  // a Slurm job's rank 0, never a pool slot
    WorkerRank w{key.first, key.second, entry.info.host(), entry.info.device(), "", 0};
    if (auto it = awaiting.find(key); it != awaiting.end()) {
      w.job = std::to_string(it->second->job);
      w.estimated_end = it->second->estimated_end;
    } else if (entry.job != 0) {
      w.job = std::to_string(entry.job);
    }
    slots.push_back(std::move(w));
  }
  return slots;
}

std::vector<RunningJob> PoolLauncher::Running() const {
  std::vector<RunningJob> running;
  for (const auto& [id, attempt] : sources_.running)
    running.push_back({std::to_string(id), attempt.priority, attempt.user,
                       attempt.preemptible && attempt.slurm_job.empty(), attempt.preempted_by != 0,
                       static_cast<int64_t>(attempt.started_at * 1000),
                       attempt.preempted_by != 0 ? std::to_string(attempt.preempted_by) : ""});
  return running;
}

// The attempts a pass starts are recorded in one transaction (one fsync however many
// start), and their ranks are told only once it has committed. A commit that fails takes
// the pass's attempts out of the running set again, as if the pass had not been.
void PoolLauncher::StartAttempts(const std::vector<Placement>& placements, double now) {
  std::vector<JobRecord> started;
  try {
    StateStore::Transaction transaction(sources_.store);
    for (const Placement& placement : placements) {
      sources_.waiting.erase(placement.job);
      auto job = sources_.store.Find(std::stoll(placement.job));  // with its job file, which the queue lacks
      if (job && StartAttempt(*job, placement, now)) started.push_back(std::move(*job));
    }
    transaction.Commit();
  } catch (...) {  // the placed jobs were queued: none of them ran before this pass
    for (const Placement& placement : placements) sources_.running.Remove(std::stoll(placement.job));
    throw;
  }
  for (const JobRecord& job : started) {
    const RunningAttempt& attempt = *sources_.running.Find(job.id);
    for (const RankKey& slot : attempt.slots) sources_.loop.SendAssign(job, attempt, slot);
  }
}

bool PoolLauncher::StartAttempt(const JobRecord& job, const Placement& placement, double now) {
  std::vector<RankKey> slots;
  for (const SlotRef& slot : placement.slots) slots.emplace_back(slot.world, slot.rank);
  if (!sources_.loop.MakeAttemptFolder(job, now)) return false;
  const RunningAttempt& attempt = sources_.loop.OpenAttempt(
      job, slots, "started on " + PlacementText(slots) + (placement.backfilled ? " (backfilled)" : ""), now);
  reported_unplaceable_.erase(job.id);
  const auto gpus = std::count_if(slots.begin(), slots.end(), [this](const RankKey& slot) {
    return sources_.ranks.entries().at(slot).info.device() == "cuda";
  });
  sources_.store.StartUsage(job.id, attempt.attempt, now, static_cast<int>(slots.size()), static_cast<int>(gpus));
  return true;
}

}  // namespace trainyard
