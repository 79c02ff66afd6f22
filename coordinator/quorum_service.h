// Note [Step quorum]
// The replicas of an elastic job agree before every optimizer step on who takes part in
// it, and a step counts only if every member of its quorum finished it. The coordinator
// decides, one QuorumService per running elastic attempt, on the loop's listening clock;
// the replicas exchange gradients among themselves on the ring of that quorum (Note [The
// replica ring] in worker/elastic/tcp_ring.h), formed again whenever its id changes.
//
// A replica joins with its ring address and the last step it committed, then beats.
// While no quorum stands, one forms once `min_replicas` have joined and either all
// `max_replicas` are there or `join_window_s` has passed since the first of them: its
// members are every live joined replica (at most max_replicas, earliest joined first),
// in ring order by replica name, its step the furthest committed step among them plus
// one, and each member behind that step is healed at the start of it from one that is
// not (HealPair: the source's live state, not a checkpoint). A quorum for step 1 heals
// every member from the first, so that all start from one state, as a run's ranks start
// from rank 0's parameters.
//
// Each member votes on the step: ok, or failed (its ring broke, its step threw). The
// step is decided once every member has voted or is gone (RemoveReplica: its process
// ended; or it joined again as a new process), or `timeout_s` after the quorum was
// given, when the members that have not voted (dead, partitioned or frozen) are out:
//  - every member voted ok: the step commits, and the next step's quorum is the same
//    one, same id, unless replicas wait to join (and there is room), when a new quorum
//    (new id) takes them in;
//  - otherwise the step does not commit, and the members that voted, ok or not, retry
//    the same step in a new quorum (with any joiners). No gradient counts twice or is
//    lost, since a step's result is kept only on commit. A step that fails
//    kMaxRetries times in a row with no member lost is given up (its failure is the
//    job's own): no next quorum.
// Fewer than min_replicas left: no quorum, the job waits for joins; the caller fails
// the attempt if none come in its own time. A quorum never forms without the state of
// the last committed step: once no live replica holds it (every member that took it is
// gone, and only joiners are left), the steps give up, and the job's checkpoints are
// the way on (the next attempt's resume). Finish (a replica took the last step) ends
// the steps too: a replica still joining then has nothing left to take part in.
//
// Ids only grow. A message naming an older quorum id, or a vote from a replica that is
// not a member of the current quorum, is fenced: the replica's view is old (it was
// partitioned, stopped, or left), it may not commit anything, and it must join again
// (and be healed) to take part. The store keeps each job's last id, written before any
// replica hears of a quorum, so ids grow across attempts and coordinator restarts too
// (the wire side: elastic_quorums.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace trainyard {

struct ReplicaAddress {
  std::string host;
  int port = 0;
  bool operator==(const ReplicaAddress& other) const { return host == other.host && port == other.port; }
};

// The source of a joiner's state at the start of its first step.
struct HealPair {
  std::string source, target;  // replica names
};

struct Quorum {
  uint64_t id = 0;
  int64_t step = 0;                   // the step it is for
  std::vector<std::string> members;   // ring order
  std::vector<ReplicaAddress> rings;  // each member's ring address, in the same order
  std::vector<HealPair> heals;        // members to be healed before the step
};

// What the service tells the replicas of `quorum_id` about `step`.
struct StepDecision {
  uint64_t quorum_id = 0;
  int64_t step = 0;
  bool commit = false;
  std::string why;             // why not, when it did not commit
  std::optional<Quorum> next;  // the quorum of the next step (this one again on a failure); none: wait
  // How long it took: from the quorum's giving to the decision on its step, or for a
  // quorum formed of joiners (quorum_id 0), from the first join to it.
  double took_s = 0;
};

enum class VoteAnswer { kCounted, kFenced };

class QuorumService {
 public:
  static constexpr int kMaxRetries = 3;
  struct Options {
    int min_replicas = 1;
    int max_replicas = 1;
    double timeout_s = 30;      // silence that puts a replica out, and the most a step's votes may take
    double join_window_s = 10;  // how long a forming quorum waits for max_replicas
  };
  // `last_id`: the highest quorum id given before (the store's), so ids never repeat.
  QuorumService(Options options, uint64_t last_id);

  // `replica` joins (again: a replica back after a failure), reachable at `ring`, having
  // committed step `committed_step` (0: none). Out of any quorum until the next one forms,
  // unless it is a member of the current one that has not voted, at the same ring address
  // and at its step (the same process, which missed the news of it): true then, and it
  // stays a member.
  bool Join(const std::string& replica, const ReplicaAddress& ring, int64_t committed_step, double now);
  // A beat from `replica` naming the quorum it holds; kFenced if its view is old.
  VoteAnswer Beat(const std::string& replica, uint64_t quorum_id, double now);
  // `replica`'s vote on `step` of quorum `quorum_id`; kFenced if it is not one of the
  // current quorum's members or names another quorum or step.
  VoteAnswer Vote(const std::string& replica, uint64_t quorum_id, int64_t step, bool ok, double now);
  // `replica` is gone (its process ended, its agent was lost).
  void RemoveReplica(const std::string& replica, double now);
  // The timers: silent replicas out, a step's deadline, a forming quorum's window.
  // Returns the decisions made since the last call, in order (a first quorum comes as a
  // decision on step 0 with `next` set).
  std::vector<StepDecision> Advance(double now);

  const std::optional<Quorum>& current() const { return current_; }
  // A replica has taken the job's last step: no quorum forms again.
  void Finish();
  // No quorum forms again: a step failed kMaxRetries times with every member there, no
  // live replica holds the last committed step's state, or Finish.
  bool given_up() const { return given_up_; }
  uint64_t last_id() const { return last_id_; }

 private:
  struct Replica {
    ReplicaAddress ring;
    int64_t committed_step = 0;
    double joined_at = 0, last_heard = 0;
  };
  // Whether `replica` is a member of the current quorum that has not left it.
  bool IsMember(const std::string& replica) const;
  // Decides the current step if every member has voted or is gone, or at its deadline.
  void DecideIfDue(double now);
  void Decide(bool commit, const std::string& why, double now);
  // A quorum of the live joined replicas for `step`, under a new id; nullopt if fewer
  // than min_replicas are live, or (giving up, `why` said) if none of them holds the
  // last committed step's state.
  std::optional<Quorum> Form(int64_t step, double now, std::string* why);
  bool Live(const Replica& replica, double now) const { return now - replica.last_heard <= options_.timeout_s; }
  // Whether replicas wait to join `quorum` and there is room for them.
  bool MembershipChanged(const Quorum& quorum, double now) const;

  Options options_;
  uint64_t last_id_ = 0;
  std::map<std::string, Replica> replicas_;
  std::optional<Quorum> current_;
  double given_at_ = 0;                // when the current quorum was given
  std::map<std::string, bool> votes_;  // of the current step, by member
  std::set<std::string> gone_;         // members of the current quorum that left it
  int retries_ = 0;                    // of the current step, with no member lost
  int64_t committed_ = 0;              // the last step committed
  bool given_up_ = false;
  std::vector<StepDecision> decided_;
};

}  // namespace trainyard
