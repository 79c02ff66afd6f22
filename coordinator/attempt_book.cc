#include "coordinator/attempt_book.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

namespace trainyard {

std::string PlacementText(const std::vector<RankKey>& slots) {
  std::string text;
  for (size_t i = 0; i < slots.size(); ++i)
    text += (i ? "," : "") + slots[i].first + ":" + std::to_string(slots[i].second);
  return text;
}

// An entry without a world ("...,<rank>") continues the world before it, as protocol 3
// wrote "<world>:<r>,<r>".
int ReplicaNumber(const RunningAttempt& attempt, const RankKey& slot) {
  if (const auto it = attempt.replica_numbers.find(slot); it != attempt.replica_numbers.end()) return it->second;
  return static_cast<int>(std::find(attempt.slots.begin(), attempt.slots.end(), slot) - attempt.slots.begin());
}

int LiveReplicas(const RunningAttempt& attempt) {
  return static_cast<int>(attempt.slots.size() - attempt.finished.size());
}

bool TakesReplacements(const RunningAttempt& attempt) {
  const int live = LiveReplicas(attempt);
  return attempt.elastic && attempt.adopted && live > 0 && live < attempt.max_replicas && attempt.preempted_by == 0 &&
         attempt.search_stop_at == 0 && !attempt.replica_succeeded && !attempt.replica_bad_input;
}

double ReplacementBackoffS(int failures) {
  constexpr double kLongestS = 60;
  return failures <= 0 ? 0 : std::min(kLongestS, std::ldexp(1.0, failures - 1));
}

bool ParsePlacement(const std::string& text, std::vector<RankKey>* slots) {
  std::stringstream in(text);
  std::string world;
  for (std::string cell; std::getline(in, cell, ',');) {
    const size_t colon = cell.rfind(':');
    if (colon != std::string::npos) world = cell.substr(0, colon);
    if (world.empty()) return false;
    try {
      size_t used = 0;
      const std::string number = colon == std::string::npos ? cell : cell.substr(colon + 1);
      const int rank = std::stoi(number, &used);
      if (used != number.size()) return false;
      slots->emplace_back(world, rank);
    } catch (const std::exception&) {
      return false;
    }
  }
  return !slots->empty();
}

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

std::optional<RunningAttempt> AttemptBook::End(StateStore& store, int64_t job, const AttemptEnding& ending,
                                               double now) {
  const RunningAttempt* running = Find(job);
  StateStore::Transaction transaction(store);
  if (running) store.EndAttempt(job, running->attempt, ending.outcome, ending.reason, now);
  if (ending.job_state == JobState::kQueued)
    store.Requeue(job, ending.job_reason, ending.requeue_at);
  else
    store.SetState(job, ending.job_state, ending.job_reason, now);
  store.AddEvent(job, ending.event, now);
  transaction.Commit();
  return Remove(job);
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
