// Note [History retention] (coordinator/state_store.h): forgetting the jobs that ended
// long ago, their figures kept as totals.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/sqlite_statement.h"
#include "coordinator/state_store.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

// A bucket's upper bound as history_totals keeps it: exact, and "inf" for +Inf.
std::string BoundKey(double bound) {
  if (std::isinf(bound)) return "inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", bound);
  return text;
}

// The first of the ascending `bounds` at or above `seconds`; +Inf past the last.
double BucketOf(double seconds, const std::vector<double>& bounds) {
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), seconds);
  return it == bounds.end() ? std::numeric_limits<double>::infinity() : *it;
}

}  // namespace

void StateStore::AddToHistory(const std::string& kind, const std::string& user, const std::string& key, double delta) {
  Statement s(*statements_,
              "INSERT INTO history_totals(kind, user, key, value) VALUES(?, ?, ?, ?) "
              "ON CONFLICT(kind, user, key) DO UPDATE SET value = value + excluded.value");
  s.Bind(1, kind).Bind(2, user).Bind(3, key).Bind(4, delta);
  s.Step();
}

std::map<std::pair<std::string, std::string>, double> StateStore::HistoryTotals(const std::string& kind) const {
  Statement s(*statements_, "SELECT user, key, value FROM history_totals WHERE kind = ?");
  s.Bind(1, kind);
  std::map<std::pair<std::string, std::string>, double> out;
  while (s.Step()) out[{s.Text(0), s.Text(1)}] = s.Real(2);
  return out;
}

int64_t StateStore::PruneHistory(double before, double now, double half_life_s,
                                 const std::vector<double>& first_start_bounds, int64_t most) {
  // A search whose trial still runs (its cancel was cut short by a crash) is kept whole,
  // and never fills a batch that older jobs are waiting behind.
  Statement pick(*statements_,
                 "SELECT id FROM jobs j WHERE ended_at > 0 AND ended_at < ? AND search = 0 AND NOT EXISTS "
                 "(SELECT 1 FROM jobs t WHERE t.search = j.id AND t.state IN ('QUEUED', 'RUNNING')) "
                 "ORDER BY ended_at LIMIT ?");
  pick.Bind(1, before).Bind(2, most);
  std::vector<int64_t> ids;
  while (pick.Step()) ids.push_back(pick.Int(0));
  if (ids.empty()) return 0;
  Transaction transaction(*this);
  int64_t forgotten = 0;
  for (int64_t id : ids) forgotten += ForgetJob(id, now, half_life_s, first_start_bounds);
  transaction.Commit();
  return forgotten;
}

int64_t StateStore::ForgetJob(int64_t id, double now, double half_life_s,
                              const std::vector<double>& first_start_bounds) {
  std::vector<int64_t> jobs = {id};
  Statement trials(*statements_, "SELECT id, state FROM jobs WHERE search = ?");
  trials.Bind(1, id);
  while (trials.Step()) {
    const std::string state = trials.Text(1);
    if (state == "QUEUED" || state == "RUNNING") return 0;  // a search whose trial runs on: kept whole
    jobs.push_back(trials.Int(0));
  }
  std::map<std::string, double> fairshare;  // by user, decayed to `now`
  for (int64_t job : jobs) {
    const std::optional<JobRecord> record = Find(job);
    if (!record) continue;
    const std::string& user = record->user;
    AddToHistory("jobs", user, ToString(record->state), 1);
    double first_start = std::numeric_limits<double>::infinity();
    bool ran = false;
    for (const AttemptRecord& a : Attempts(job)) {
      first_start = std::min(first_start, a.started_at);
      if (a.ended_at > 0) AddToHistory("outcomes", "", OutcomeName(a.end), 1);
      if (a.ran_from <= 0) continue;
      ran = true;
      AddToHistory("usage_attempts", user, "", 1);
      AddToHistory("rank_seconds", user, "", a.RankSeconds(now));
      AddToHistory("gpu_seconds", user, "", a.GpuSeconds(now));
      fairshare[user] += DecayedUsage::Of(a.ranks, a.ran_from, a.ended_at > 0 ? a.ended_at : now, now, half_life_s);
    }
    if (ran) AddToHistory("usage_jobs", user, "", 1);
    if (!std::isinf(first_start)) {
      const double seconds = std::max(0.0, first_start - record->submitted_at);
      AddToHistory("first_start", "", BoundKey(BucketOf(seconds, first_start_bounds)), 1);
      AddToHistory("first_start_sum", "", "", seconds);
      AddToHistory("first_start_count", "", "", 1);
    }
  }
  FoldFairShare(fairshare, now, half_life_s);
  // Children first: the rows refer to the job's own.
  for (const char* sql : {"DELETE FROM rung_results WHERE search = ?", "DELETE FROM trials WHERE search = ?",
                          "DELETE FROM searches WHERE job = ?"}) {
    Statement s(*statements_, sql);
    s.Bind(1, id);
    s.Step();
  }
  for (int64_t job : jobs)
    for (const char* sql : {"DELETE FROM epochs WHERE job = ?", "DELETE FROM events WHERE job = ?",
                            "DELETE FROM elastic_jobs WHERE job = ?", "DELETE FROM attempts WHERE job = ?",
                            "DELETE FROM jobs WHERE id = ?"}) {
      Statement s(*statements_, sql);
      s.Bind(1, job);
      s.Step();
    }
  return int64_t(jobs.size());
}

// Each user's total moves to `now` (one multiplication, as in DecayedUsage) and takes the
// forgotten attempts' figures, decayed to `now` too.
void StateStore::FoldFairShare(const std::map<std::string, double>& decayed_at_now, double now, double half_life_s) {
  for (const auto& [user, value] : decayed_at_now) {
    DecayedUsage total(half_life_s);
    Statement old(*statements_,
                  "SELECT value, as_of FROM history_totals WHERE kind = 'fairshare' AND user = ? AND key = ''");
    old.Bind(1, user);
    if (old.Step()) total.AddTotal(user, old.Real(0), old.Real(1));
    total.AddTotal(user, value, now);
    const double moved = total.At(now)[user];
    Statement s(*statements_,
                "INSERT INTO history_totals(kind, user, key, value, as_of) VALUES('fairshare', ?, '', ?, ?) "
                "ON CONFLICT(kind, user, key) DO UPDATE SET value = excluded.value, as_of = excluded.as_of");
    s.Bind(1, user).Bind(2, moved).Bind(3, now);
    s.Step();
  }
}

FoldedHistogram StateStore::PrunedFirstStarts() const {
  FoldedHistogram out;
  for (const auto& [user_key, count] : HistoryTotals("first_start")) {
    const double bound =
        user_key.second == "inf" ? std::numeric_limits<double>::infinity() : std::stod(user_key.second);
    out.by_upper_bound[bound] += int64_t(count);
  }
  for (const auto& [user_key, sum] : HistoryTotals("first_start_sum")) out.sum += sum;
  for (const auto& [user_key, count] : HistoryTotals("first_start_count")) out.count += int64_t(count);
  return out;
}

}  // namespace trainyard
