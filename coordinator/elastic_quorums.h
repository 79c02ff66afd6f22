// The coordinator's side of elastic attempts on the wire: a QuorumService (Note [Step
// quorum] in quorum_service.h) per open elastic attempt, the replicas' requests that
// wait for its answer, and the quorum ids kept in the store.
//
// A replica joins, beats and votes with the messages of proto/trainyard.proto
// (ReplicaJoin, ReplicaBeat, StepVote), sent by the rank that speaks for it and named
// after that rank, "<world>:<rank>"; the caller has authenticated the sender (its rank
// token) and checked that it belongs to the attempt. A join and a vote wait for an
// answer, a StepDecision: a voter gets the decision on its step with the next quorum
// (absent when that quorum leaves it out: it joins again), a joiner the first quorum
// that includes it. A message that names an old view is answered with Fenced at once.
// When an attempt's steps give up, every waiting replica is told so (`over`).
//
// A quorum's id is written to the store before any replica hears of it, so a
// coordinator that restarts never gives an id twice (Note [Step quorum]: ids only grow,
// which is what fences an old view). Each attempt has a ring secret of its own, drawn
// when it opens and sent only inside quorums (CURVE-encrypted on the wire): the ring's
// handshakes prove it (Note [The replica ring]).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/quorum_service.h"
#include "trainyard.pb.h"

namespace trainyard {

class StateStore;

// A message for the ZeroMQ peer `identity`.
struct QuorumMessage {
  std::string identity;
  wire::Envelope message;
};

// Something a job's events should say: a quorum formed, a step that did not commit.
struct QuorumEvent {
  int64_t job = 0;
  std::string text;
};

class ElasticQuorums {
 public:
  explicit ElasticQuorums(StateStore& store) : store_(store) {}

  // Starts the quorum of `job`'s attempt `attempt`; its ids continue from the store's.
  void Open(int64_t job, int attempt, QuorumService::Options options);
  // The attempt ended: its quorum is forgotten, and what its replicas wait for with it.
  void Close(int64_t job, int attempt);
  bool IsOpen(int64_t job, int attempt) const { return open_.count({job, attempt}) > 0; }

  // The replica `replica` (authenticated by the caller) at ZeroMQ peer `identity`. Each
  // returns why the message is refused ("": taken); a refused message changes nothing.
  std::string Join(const std::string& identity, const std::string& replica, const wire::ReplicaJoin& join, double now);
  std::string Beat(const std::string& identity, const std::string& replica, const wire::ReplicaBeat& beat, double now);
  std::string Vote(const std::string& identity, const std::string& replica, const wire::StepVote& vote, double now);
  // A replica took the attempt's last step: no quorum forms again, and the replicas
  // still waiting to join are told so.
  void Finish(int64_t job, int attempt);
  // `replica`'s process ended, or its agent was lost: it is out of every quorum.
  void ReplicaGone(const std::string& replica, double now);
  // The services' timers (silences, step deadlines, forming windows).
  void Advance(double now);

  // What to send, and what to record, since the last call.
  std::vector<QuorumMessage> TakeMessages() { return std::exchange(messages_, {}); }
  std::vector<QuorumEvent> TakeEvents() { return std::exchange(events_, {}); }

 private:
  // A join or a vote waiting for its answer.
  struct Waiting {
    std::string identity;
    bool vote = false;
    uint64_t quorum_id = 0;  // of the vote
    int64_t step = 0;
  };
  struct OpenAttempt {
    OpenAttempt(QuorumService::Options options, uint64_t last_id, std::string ring_secret)
        : service(options, last_id), secret(std::move(ring_secret)), kept_id(last_id) {}
    QuorumService service;
    std::string secret;
    uint64_t kept_id = 0;                    // the highest id written to the store
    std::map<std::string, Waiting> waiting;  // by replica
  };
  using Key = std::pair<int64_t, int>;

  OpenAttempt* Find(int64_t job, int attempt);
  // Takes the service's decisions on `key`: ids kept, then answers and events.
  void Settle(const Key& key, OpenAttempt& open, double now);
  void Answer(const Key& key, OpenAttempt& open, const StepDecision& decision);
  void Fence(const std::string& identity, const Key& key, uint64_t quorum_id, const std::string& why);
  wire::Envelope DecisionFor(const Key& key, const OpenAttempt& open, const StepDecision& decision,
                             const std::string& replica) const;

  StateStore& store_;
  std::map<Key, OpenAttempt> open_;
  std::vector<QuorumMessage> messages_;
  std::vector<QuorumEvent> events_;
};

}  // namespace trainyard
