// The coordinator's registry of worker ranks: who is registered, with which tokens,
// when each was last heard on the listening clock, and which world ids are bound to
// which world tokens. Owned by the loop thread; the Server decides what a registration,
// a silence or a refusal does to the attempts, and the registry keeps the facts.
//
// Note [Worlds cannot be squatted]
// A world's token binds its id from the first registration on, in the store, so across
// restarts too, and whether or not its agent is heard from: a silent agent (a stalled
// host) comes back with its own token and is taken back, while anyone else claiming the
// id (a worker-key holder hoping for the silent agent's next assignment) is refused,
// counted, and shown on the dashboard as a warning. Under --slurm the ids "slurm-<id>"
// are the coordinator's own, and Slurm's job ids are easy to guess: only a registration
// with the world token of the coordinator's own submission of that Slurm job may bind
// one (SlurmLauncher::RegistrationRefusal), so no one can claim the next job's world ahead of it.
// A rank's slot is held against another rank token while its holder is alive (heard
// within the silence limit); a silent holder's slot goes to whoever registers with the
// world's token.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/listening_clock.h"
#include "trainyard.pb.h"

namespace trainyard {

class StateStore;

// A pool slot: (world, rank) of an agent (an agent is a world of its own, rank 0).
using RankKey = std::pair<std::string, int>;

// A registered worker rank, as its own messages describe it.
struct RankEntry {
  wire::RankInfo info;
  std::string token;     // the rank token it registered with
  std::string identity;  // ZeroMQ routing id of its latest authenticated message
  double last_seen = 0;  // on the listening clock (Note [Listening time])
  int64_t job = 0;       // what its latest heartbeat says it runs; 0: idle
  int attempt = 0;
  std::string last_log_line;
  std::string worker_key;  // the public key it registered with (Note [Peer text is bounded at reception])
};

// A warning the dashboard shows (a squat attempt).
struct Warning {
  double at = 0;  // wall clock
  std::string text;
};

class RankRegistry {
 public:
  struct Limits {
    double silence_s = 3;                     // heartbeat period x liveness: a rank silent longer is gone
    int64_t max_ranks_per_worker_key = 4096;  // registered at once (Note [Peer text is bounded at reception])
  };
  static constexpr size_t kKeptWarnings = 20;

  // Reads the world tokens the store keeps; `store` and `clock` outlive the registry.
  RankRegistry(StateStore& store, const ListeningClock& clock, Limits limits);

  const std::map<RankKey, RankEntry>& entries() const { return ranks_; }
  bool empty() const { return ranks_.empty(); }
  RankEntry* Find(const RankKey& key);
  const RankEntry* Find(const RankKey& key) const;
  // The registered rank `key` if `token` is its rank token; otherwise null, with why in `refusal`.
  RankEntry* Authenticated(const RankKey& key, const std::string& token, std::string* refusal);
  // "agent <world>" or "rank <r> of world <world>", with its pid and host when registered.
  std::string Describe(const RankKey& key) const;
  // Listening seconds since the rank was last heard, and whether that is within the limit.
  double SilentFor(const RankEntry& entry) const { return clock_.Now() - entry.last_seen; }
  bool Alive(const RankEntry& entry) const { return SilentFor(entry) <= limits_.silence_s; }
  double silence_s() const { return limits_.silence_s; }

  // Whether `world` is bound to a token, and whether that token is not `token`.
  bool IsBound(const std::string& world) const { return world_tokens_.count(world) > 0; }
  bool BoundElsewhere(const std::string& world, const std::string& token) const;
  // Binds `world` to `token` in the store and here; a world bound already keeps its token.
  void Bind(const std::string& world, const std::string& token, double now);
  // Reads the bindings from the store again, after it forgot some.
  void ReloadBindings();

  // Why a registration as `key` with `rank_token` and `worker_key` may not take the slot
  // (a live holder with another rank token, or the key's cap), or "". The world token is
  // checked before, with BoundElsewhere.
  std::string HolderRefusal(const RankKey& key, const std::string& rank_token, const std::string& worker_key) const;
  // Records an admitted registration, binding its world if new (`now`: wall clock). True
  // if the rank was registered already with this rank token (a re-registration).
  bool Register(const wire::Register& message, const std::string& identity, const std::string& worker_key, double now);
  // Records a heartbeat of an authenticated rank.
  void NoteHeartbeat(RankEntry* entry, const std::string& identity, const wire::Heartbeat& message);
  // Ranks registered with `worker_key`, other than `except`.
  int64_t RanksOfKey(const std::string& worker_key, const RankKey& except) const;
  // A registered rank on `host`, or null.
  const std::pair<const RankKey, RankEntry>* OnHost(const std::string& host) const;
  // The ranks silent past the limit, in key order.
  std::vector<RankKey> Silent() const;
  void Remove(const RankKey& key) { ranks_.erase(key); }
  // Every rank heard now: after a stall of the loop (Note [Listening time]).
  void HearAllNow();

  // A refused claim on a world (counted, and kept as one of the newest warnings).
  void NoteSquat(const std::string& text, double now);
  int64_t squat_attempts() const { return squat_attempts_; }
  const std::deque<Warning>& warnings() const { return warnings_; }

 private:
  StateStore& store_;
  const ListeningClock& clock_;
  Limits limits_;
  std::map<RankKey, RankEntry> ranks_;
  std::map<std::string, std::string> world_tokens_;  // world id -> its token, as the store keeps it
  int64_t squat_attempts_ = 0;
  std::deque<Warning> warnings_;  // the newest kKeptWarnings
};

}  // namespace trainyard
