// Length-aware dynamic batching: the queue of admitted requests and the rule that turns
// it into batches. Pure logic with the time passed in, so tests drive it without
// threads or sleeps; the dispatcher (server_core.h) owns one and calls it under its lock.
//
// The rule. The anchor is the queued request that runs first: the lowest priority
// value, then the oldest. Its batch takes requests of the same model version only, from
// that version's oldest queued requests (a window of kLengthWindowBatches batches' rows,
// so that later requests cannot keep overtaking an earlier one). With length_aware on,
// the batch grows from the anchor outwards through those candidates sorted by length, each time taking the neighbour
// whose longest row is closest to the anchor's, so that rows of similar length share a batch and padding (every row is
// padded to the batch's longest) stays small. Off, it takes candidates in the anchor's
// order. Growth stops at max_batch_size rows or when one more would put rows x longest
// over max_batch_tokens. The batch goes when it is full (no candidate fits any more), or
// its size is a preferred size, or the anchor has waited max_queue_delay_ms; until then
// the dispatcher sleeps until the anchor's delay runs out or a request arrives.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "worker/serve/infer_request.h"

namespace trainyard {

constexpr int kLengthWindowBatches = 4;

struct BatchPolicy {
  int max_rows = 32;
  int64_t max_tokens = 4096;
  std::vector<int> preferred_rows;
  double max_delay_ms = 5;
  size_t max_queue = 1024;
  bool length_aware = true;
};

struct Batch {
  std::shared_ptr<const VersionMeta> meta;
  std::vector<RequestPtr> requests;
  int rows = 0;
  int seq = 0;  // the longest row: every row is padded to it
  int64_t padded_tokens() const { return int64_t(rows) * seq; }
  int64_t real_tokens() const;
  // Each request's rows x its own longest row, summed: the unit the queue is counted in.
  int64_t request_tokens() const;
};

class Batcher {
 public:
  explicit Batcher(BatchPolicy policy) : policy_(std::move(policy)) {}

  // Queues `request`; false (and nothing queued) when the queue holds max_queue already.
  bool Push(RequestPtr request);
  // Removes and returns the queued requests that were cancelled or whose deadline is
  // before `now`; the caller answers them.
  std::vector<RequestPtr> TakeDead(ServeClock::time_point now);
  // Removes and returns the next batch that is ready at `now`, if any. Otherwise sets
  // *wake (if the queue is not empty) to when the oldest anchor's delay runs out.
  std::optional<Batch> Next(ServeClock::time_point now, ServeClock::time_point* wake);
  // Asks up to `budget` queued requests whether their client has gone
  // (InferRequest::ClientGone, a call into the transport) and cancels those that have.
  // Each call goes on from where the previous one stopped, round the queue, so a long
  // queue costs the caller `budget` questions per call, not one per request.
  void SweepGone(size_t budget);
  // Removes and returns every queued request of `meta` (a version going away).
  std::vector<RequestPtr> TakeAll(const VersionMeta* meta);

  size_t size() const { return queue_.size(); }
  // Padded tokens queued (each request's rows x its longest row): what the server's
  // cost model turns into a wait.
  int64_t queued_tokens() const { return queued_tokens_; }
  // Requests queued for one version.
  size_t CountFor(const VersionMeta* meta) const;
  const BatchPolicy& policy() const { return policy_; }

 private:
  using Entry = std::list<RequestPtr>::iterator;
  // The batch the anchor would take now, and whether it is full.
  std::vector<Entry> Grow(Entry anchor, bool* full);
  bool Fits(int rows, int seq) const;
  static bool RunsBefore(const RequestPtr& a, const RequestPtr& b);
  Batch Remove(const std::vector<Entry>& members);

  BatchPolicy policy_;
  std::list<RequestPtr> queue_;  // arrival order
  int64_t queued_tokens_ = 0;
  size_t sweep_from_ = 0;  // SweepGone's position: an index into queue_, wrapped
};

}  // namespace trainyard
