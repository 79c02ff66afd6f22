// The searches on the coordinator's loop (Note [Search life cycle] and Note [ASHA] in
// coordinator/search.h): which trials to queue and when, each trial's verdict at a rung,
// when a search ends, and its search.csv. A trial is an ordinary job: the driver stores
// and queues it, and the loop runs it like any other. What the driver needs of the loop
// (a scheduling pass, a cancel, a quota's count, a file written beneath the runs folder)
// it asks through SearchLoop; stopping a running trial is the loop's own business, with
// the rung epoch Judge returns.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "common/curve/curve_keys.h"
#include "coordinator/job_views.h"
#include "coordinator/state_store.h"

namespace trainyard {

class SearchLoop {
 public:
  // A trial's job was queued: a scheduling pass is due.
  virtual void TrialQueued() = 0;
  // Cancels job `id` as `client` would (a trial of a search being cancelled).
  virtual void CancelTrial(int64_t id, const ClientIdentity& client) = 0;
  // Jobs `user` has queued (--user-max-queued counts a search's trials too).
  virtual int QueuedJobsOf(const std::string& user) const = 0;
  // Writes `bytes` to <runs>/<job>/`name`, atomically.
  virtual void WriteRunsFile(int64_t job, const std::string& name, const std::string& bytes) = 0;

 protected:
  ~SearchLoop() = default;
};

class SearchDriver {
 public:
  // `store`, `views` and `loop` outlive the driver; `user_max_queued` is --user-max-queued (0: none).
  SearchDriver(StateStore& store, const JobViews& views, SearchLoop& loop, int user_max_queued);

  // Something may have ended a trial or let a search queue one: the next Advance runs
  // whatever the time.
  void MarkDue() { due_ = true; }
  // A trial of `search` changed (submitted, a new row, stopped): its search.csv is
  // rewritten by the next Advance.
  void MarkStale(int64_t search) { stale_csvs_.insert(search); }
  // When due, and every 2 s besides, so that no way a trial ends can leave its search
  // waiting: each running search queues trials up to its max_concurrent (and its user's
  // queue limit), or ends once every trial has; then the stale search.csv files are written.
  void Advance(double now);
  // Judges a trial's epoch row (Note [ASHA]) inside the caller's transaction. Returns the
  // rung epoch the trial was stopped at, now or before; 0 while it goes on, and for a job
  // that is no trial.
  int Judge(int64_t job, int epoch, const std::string& csv_header, const std::string& csv_line, double now);
  // Ends a running search as CANCELLED by `client` (`who` in its events), then cancels
  // its trials not yet ended. The search ends first, so a crash midway leaves no search
  // queueing trials.
  void Cancel(const JobRecord& search, const ClientIdentity& client, const std::string& who, double now);
  // Writes <runs>/<search>/search.csv: a row per trial.
  void WriteCsv(int64_t search);

 private:
  void AdvanceSearch(const JobRecord& search, double now);
  // The trial's job and the trial's record of it commit together, so a restart can
  // neither lose a trial nor submit one twice.
  void SubmitTrial(const JobRecord& search, const TrialRecord& trial, double now);
  void Finish(const JobRecord& search, double now);

  StateStore& store_;
  const JobViews& views_;
  SearchLoop& loop_;
  int user_max_queued_;
  bool due_ = true;
  double last_pass_ = 0;
  std::set<int64_t> stale_csvs_;
};

// Whether a job in `state` has ended (SUCCEEDED, FAILED, CANCELLED or STOPPED).
bool Ended(JobState state);

}  // namespace trainyard
