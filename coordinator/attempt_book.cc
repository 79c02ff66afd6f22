#include "coordinator/attempt_book.h"

#include <algorithm>
#include <utility>

namespace trainyard {

RunningAttempt* AttemptBook::Find(int64_t job) {
  auto it = attempts_.find(job);
  return it == attempts_.end() ? nullptr : &it->second;
}

const RunningAttempt* AttemptBook::Find(int64_t job) const {
  auto it = attempts_.find(job);
  return it == attempts_.end() ? nullptr : &it->second;
}

RunningAttempt* AttemptBook::Find(int64_t job, int attempt) {
  RunningAttempt* running = Find(job);
  return running && running->attempt == attempt ? running : nullptr;
}

RunningAttempt& AttemptBook::Add(RunningAttempt attempt) {
  const int64_t job = attempt.job;
  return attempts_[job] = std::move(attempt);
}

std::optional<RunningAttempt> AttemptBook::Remove(int64_t job) {
  auto it = attempts_.find(job);
  if (it == attempts_.end()) return std::nullopt;
  RunningAttempt attempt = std::move(it->second);
  attempts_.erase(it);
  return attempt;
}

RunningAttempt* AttemptBook::Awaiting(const RankKey& slot) {
  for (auto& [job, attempt] : attempts_)
    if (std::count(attempt.slots.begin(), attempt.slots.end(), slot) && !attempt.finished.count(slot)) return &attempt;
  return nullptr;
}

std::map<RankKey, const RunningAttempt*> AttemptBook::AwaitingBySlot() const {
  std::map<RankKey, const RunningAttempt*> awaiting;
  for (const auto& [job, attempt] : attempts_)
    for (const RankKey& slot : attempt.slots)
      if (!attempt.finished.count(slot)) awaiting.emplace(slot, &attempt);
  return awaiting;
}

void AttemptBook::RestartGraces(double listened) {
  for (auto& [job, attempt] : attempts_) attempt.started_listening = listened;
}

}  // namespace trainyard
