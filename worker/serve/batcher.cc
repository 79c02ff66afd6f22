#include "worker/serve/batcher.h"

#include <algorithm>
#include <cstdlib>

namespace trainyard {

int64_t Batch::real_tokens() const {
  int64_t total = 0;
  for (const auto& request : requests) total += request->real_tokens();
  return total;
}

int64_t Batch::request_tokens() const {
  int64_t total = 0;
  for (const auto& request : requests) total += int64_t(request->rows().size()) * request->longest();
  return total;
}

bool Batcher::Push(RequestPtr request) {
  if (queue_.size() >= policy_.max_queue) return false;
  queued_tokens_ += int64_t(request->rows().size()) * request->longest();
  queue_.push_back(std::move(request));
  return true;
}

std::vector<RequestPtr> Batcher::TakeDead(ServeClock::time_point now) {
  std::vector<RequestPtr> dead;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->cancelled() || (*it)->deadline() < now) {
      queued_tokens_ -= int64_t((*it)->rows().size()) * (*it)->longest();
      dead.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return dead;
}

void Batcher::SweepGone(size_t budget) {
  if (queue_.empty()) return;
  if (sweep_from_ >= queue_.size()) sweep_from_ = 0;
  auto it = std::next(queue_.begin(), std::ptrdiff_t(sweep_from_));
  for (size_t asked = 0; asked < std::min(budget, queue_.size()); ++asked) {
    if (!(*it)->cancelled() && (*it)->ClientGone()) (*it)->Cancel();
    if (++it == queue_.end()) it = queue_.begin();
  }
  sweep_from_ = (sweep_from_ + std::min(budget, queue_.size())) % queue_.size();
}

std::vector<RequestPtr> Batcher::TakeAll(const VersionMeta* meta) {
  std::vector<RequestPtr> taken;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (&(*it)->meta() == meta) {
      queued_tokens_ -= int64_t((*it)->rows().size()) * (*it)->longest();
      taken.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

size_t Batcher::CountFor(const VersionMeta* meta) const {
  return std::count_if(queue_.begin(), queue_.end(), [&](const RequestPtr& r) { return &r->meta() == meta; });
}

bool Batcher::RunsBefore(const RequestPtr& a, const RequestPtr& b) {
  return a->priority() != b->priority() ? a->priority() < b->priority() : a->arrival() < b->arrival();
}

bool Batcher::Fits(int rows, int seq) const {
  return rows <= policy_.max_rows && int64_t(rows) * seq <= policy_.max_tokens;
}

std::vector<Batcher::Entry> Batcher::Grow(Entry anchor, bool* full) {
  // Companions come from the version's oldest requests only, a window of a few batches'
  // rows: enough choice of lengths, while a request is never passed over by more than a
  // window of later ones (which the admission's wait estimate relies on).
  const size_t window = size_t(kLengthWindowBatches) * size_t(policy_.max_rows);
  std::vector<Entry> candidates;
  for (Entry it = queue_.begin(); it != queue_.end() && candidates.size() < window; ++it)
    if (it != anchor && &(*it)->meta() == &(*anchor)->meta() && !(*it)->cancelled()) candidates.push_back(it);
  std::vector<Entry> members{anchor};
  int rows = static_cast<int>((*anchor)->rows().size());
  int seq = (*anchor)->longest();
  *full = false;
  auto try_add = [&](Entry e) {
    const int next_rows = rows + static_cast<int>((*e)->rows().size());
    const int next_seq = std::max(seq, (*e)->longest());
    if (!Fits(next_rows, next_seq)) return false;
    members.push_back(e);
    rows = next_rows;
    seq = next_seq;
    return true;
  };
  if (!policy_.length_aware) {
    std::stable_sort(candidates.begin(), candidates.end(), [](Entry a, Entry b) { return RunsBefore(*a, *b); });
    for (Entry e : candidates) {
      if (!try_add(e)) {
        *full = true;
        return members;
      }
    }
    *full = rows >= policy_.max_rows;
    return members;
  }
  // Outwards from the anchor's length, the closer neighbour first.
  const int anchor_len = (*anchor)->longest();
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](Entry a, Entry b) { return (*a)->longest() < (*b)->longest(); });
  auto split = std::lower_bound(candidates.begin(), candidates.end(), anchor_len,
                                [](Entry e, int len) { return (*e)->longest() < len; });
  auto below = std::make_reverse_iterator(split);  // shorter, nearest first
  auto above = split;                              // as long or longer, nearest first
  while (below != candidates.rend() || above != candidates.end()) {
    const bool take_above =
        below == candidates.rend() || (above != candidates.end() && std::abs((**above)->longest() - anchor_len) <=
                                                                        std::abs((**below)->longest() - anchor_len));
    Entry e = take_above ? *above : *below;
    if (!try_add(e)) {
      *full = true;
      return members;
    }
    if (take_above)
      ++above;
    else
      ++below;
  }
  *full = rows >= policy_.max_rows;
  return members;
}

Batch Batcher::Remove(const std::vector<Entry>& members) {
  Batch batch;
  batch.meta = (*members.front())->meta_ptr();
  for (Entry e : members) {
    batch.rows += static_cast<int>((*e)->rows().size());
    batch.seq = std::max(batch.seq, (*e)->longest());
    queued_tokens_ -= int64_t((*e)->rows().size()) * (*e)->longest();
    batch.requests.push_back(std::move(*e));
    queue_.erase(e);
  }
  return batch;
}

std::optional<Batch> Batcher::Next(ServeClock::time_point now, ServeClock::time_point* wake) {
  // Anchors in run order, one per version: the first of each version is its anchor.
  std::vector<Entry> anchors;
  for (Entry it = queue_.begin(); it != queue_.end(); ++it) {
    if ((*it)->cancelled()) continue;
    auto same = std::find_if(anchors.begin(), anchors.end(), [&](Entry a) { return &(*a)->meta() == &(*it)->meta(); });
    if (same == anchors.end())
      anchors.push_back(it);
    else if (RunsBefore(*it, **same))
      *same = it;
  }
  std::stable_sort(anchors.begin(), anchors.end(), [](Entry a, Entry b) { return RunsBefore(*a, *b); });
  const auto delay =
      std::chrono::duration_cast<ServeClock::duration>(std::chrono::duration<double, std::milli>(policy_.max_delay_ms));
  std::optional<ServeClock::time_point> earliest;
  for (Entry anchor : anchors) {
    bool full = false;
    std::vector<Entry> members = Grow(anchor, &full);
    int rows = 0;
    for (Entry e : members) rows += static_cast<int>((*e)->rows().size());
    const bool preferred =
        std::find(policy_.preferred_rows.begin(), policy_.preferred_rows.end(), rows) != policy_.preferred_rows.end();
    const ServeClock::time_point due = (*anchor)->arrival() + delay;
    if (full || preferred || due <= now) return Remove(members);
    if (!earliest || due < *earliest) earliest = due;
  }
  if (earliest && wake) *wake = *earliest;
  return std::nullopt;
}

}  // namespace trainyard
