#include "coordinator/rank_registry.h"

#include <algorithm>

#include "coordinator/state_store.h"

namespace trainyard {

RankRegistry::RankRegistry(StateStore& store, const ListeningClock& clock, Limits limits)
    : store_(store), clock_(clock), limits_(limits), world_tokens_(store.WorldTokens()) {}

RankEntry* RankRegistry::Find(const RankKey& key) {
  auto it = ranks_.find(key);
  return it == ranks_.end() ? nullptr : &it->second;
}

const RankEntry* RankRegistry::Find(const RankKey& key) const {
  auto it = ranks_.find(key);
  return it == ranks_.end() ? nullptr : &it->second;
}

RankEntry* RankRegistry::Authenticated(const RankKey& key, const std::string& token, std::string* refusal) {
  RankEntry* entry = Find(key);
  if (entry && !token.empty() && entry->token == token) return entry;
  *refusal = "rank " + std::to_string(key.second) + " of world " + key.first + " " +
             (entry ? "with a token that is not its own" : "which is not registered");
  return nullptr;
}

std::string RankRegistry::Describe(const RankKey& key) const {
  // An agent is a world of its own; rank > 0 only comes from agents of protocol 3.
  std::string text =
      key.second == 0 ? "agent " + key.first : "rank " + std::to_string(key.second) + " of world " + key.first;
  if (const RankEntry* entry = Find(key))
    text += " (pid " + std::to_string(entry->info.pid()) + " on " + entry->info.host() + ")";
  return text;
}

bool RankRegistry::BoundElsewhere(const std::string& world, const std::string& token) const {
  auto bound = world_tokens_.find(world);
  return bound != world_tokens_.end() && bound->second != token;
}

void RankRegistry::Bind(const std::string& world, const std::string& token, double now) {
  if (IsBound(world)) return;
  store_.KeepWorldToken(world, token, now);  // committed before the binding is used
  world_tokens_[world] = token;
}

void RankRegistry::ReloadBindings() { world_tokens_ = store_.WorldTokens(); }

std::string RankRegistry::HolderRefusal(const RankKey& key, const std::string& rank_token,
                                        const std::string& worker_key) const {
  const RankEntry* held = Find(key);
  if (held && held->token != rank_token && Alive(*held))
    return Describe(key) + " is held by a live process; a registration cannot take its slot";
  if (!worker_key.empty() && RanksOfKey(worker_key, key) >= limits_.max_ranks_per_worker_key)
    return "worker key " + worker_key.substr(0, 8) + "... already holds " +
           std::to_string(limits_.max_ranks_per_worker_key) +
           " registered ranks, the most --max-ranks-per-worker-key allows";
  return "";
}

bool RankRegistry::Register(const wire::Register& message, const std::string& identity, const std::string& worker_key,
                            double now) {
  const wire::RankInfo& rank = message.rank();
  const RankKey key{rank.world(), rank.rank()};
  Bind(key.first, message.world_token(), now);
  const RankEntry* held = Find(key);
  const bool known = held && held->token == message.rank_token();
  RankEntry& entry = ranks_[key];
  entry.info = rank;
  entry.token = message.rank_token();
  entry.identity = identity;
  entry.worker_key = worker_key;
  entry.last_seen = clock_.Now();
  entry.job = message.job_id();
  entry.attempt = message.attempt();
  return known;
}

void RankRegistry::NoteHeartbeat(RankEntry* entry, const std::string& identity, const wire::Heartbeat& message) {
  entry->identity = identity;
  entry->last_seen = clock_.Now();
  entry->job = message.job_id();
  entry->attempt = message.attempt();
  if (!message.last_log_line().empty()) entry->last_log_line = message.last_log_line();
}

int64_t RankRegistry::RanksOfKey(const std::string& worker_key, const RankKey& except) const {
  return std::count_if(ranks_.begin(), ranks_.end(), [&](const auto& entry) {
    return entry.first != except && entry.second.worker_key == worker_key;
  });
}

const std::pair<const RankKey, RankEntry>* RankRegistry::OnHost(const std::string& host) const {
  auto it =
      std::find_if(ranks_.begin(), ranks_.end(), [&](const auto& entry) { return entry.second.info.host() == host; });
  return it == ranks_.end() ? nullptr : &*it;
}

std::vector<RankKey> RankRegistry::Silent() const {
  std::vector<RankKey> silent;
  for (const auto& [key, entry] : ranks_)
    if (!Alive(entry)) silent.push_back(key);
  return silent;
}

void RankRegistry::HearAllNow() {
  for (auto& [key, entry] : ranks_) entry.last_seen = clock_.Now();
}

void RankRegistry::NoteSquat(const std::string& text, double now) {
  ++squat_attempts_;
  warnings_.push_back({now, text});
  if (warnings_.size() > kKeptWarnings) warnings_.pop_front();
}

}  // namespace trainyard
