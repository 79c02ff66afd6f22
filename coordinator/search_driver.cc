#include "coordinator/search_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/bounded_json.h"
#include "coordinator/search.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

using json = nlohmann::json;

std::string MetricText(double value) {
  if (std::isnan(value)) return "none";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

std::string ParamsText(const std::string& params_json) {
  const json params = ParseBoundedJsonOrDiscarded(params_json);
  std::string out;
  if (!params.is_array()) return out;
  for (const json& p : params)
    if (p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_string())
      out += (out.empty() ? "" : ", ") + p[0].get<std::string>() + "=" + p[1].get<std::string>();
  return out;
}

// A CSV cell: the rows Trainyard writes hold no comma (common/csv.h).
std::string Cell(std::string text) {
  std::replace(text.begin(), text.end(), ',', ';');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

bool Ended(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled ||
         state == JobState::kStopped;
}

SearchDriver::SearchDriver(StateStore& store, const JobViews& views, SearchLoop& loop, int user_max_queued)
    : store_(store), views_(views), loop_(loop), user_max_queued_(user_max_queued) {}

void SearchDriver::Advance(double now) {
  if (!due_ && now - last_pass_ < 2) return;
  due_ = false;
  last_pass_ = now;
  for (const JobRecord& job : store_.JobsIn(JobState::kRunning))
    if (job.is_search) AdvanceSearch(job, now);
  for (int64_t search : std::exchange(stale_csvs_, {})) WriteCsv(search);
}

void SearchDriver::AdvanceSearch(const JobRecord& search, double now) {
  const auto record = store_.FindSearch(search.id);
  if (!record) return;
  const std::vector<TrialRecord> trials = store_.Trials(search.id);
  int active = 0;
  bool all_ended = true;
  for (const TrialRecord& t : trials) {
    if (t.job == 0) {
      all_ended = false;
      continue;
    }
    const auto job = store_.Find(t.job);
    if (job && !Ended(job->state)) {
      ++active;
      all_ended = false;
    }
  }
  if (all_ended) return Finish(search, now);
  // Under --user-max-queued, trials wait while their user's queue is full.
  const int queue_limit = user_max_queued_;
  int queued = queue_limit > 0 ? loop_.QueuedJobsOf(search.user) : 0;
  for (const TrialRecord& t : trials) {
    if (active >= record->max_concurrent || (queue_limit > 0 && queued >= queue_limit)) break;
    if (t.job != 0) continue;
    SubmitTrial(search, t, now);
    ++active;
    ++queued;
  }
}

void SearchDriver::SubmitTrial(const JobRecord& search, const TrialRecord& trial, double now) {
  NewJob job = trial.job_fields;
  job.name = trial.name;
  job.spec_yaml = trial.yaml;
  job.source = trial.source;
  job.base_dir = trial.base_dir;
  job.user = search.user;
  job.search = search.id;
  bool created = false;
  StateStore::Transaction transaction(store_);
  const JobRecord record = store_.Submit(job, now, &created);
  store_.SetTrialJob(search.id, trial.trial, record.id);
  const std::string params = ParamsText(trial.params_json);
  store_.AddEvent(record.id,
                  "submitted by search " + std::to_string(search.id) + " as trial " + std::to_string(trial.trial) +
                      " (" + params + ") for " + (search.user.empty() ? std::string("an unnamed user") : search.user),
                  now);
  store_.AddEvent(
      search.id,
      "trial " + std::to_string(trial.trial) + " (" + params + ") submitted as job " + std::to_string(record.id), now);
  transaction.Commit();
  spdlog::info("search {}: trial {} queued as job {}", search.id, trial.trial, record.id);
  loop_.TrialQueued();
  stale_csvs_.insert(search.id);
}

void SearchDriver::Finish(const JobRecord& search, double now) {
  wire::SearchReport report;
  views_.FillSearchReport(search.id, &report);
  int succeeded = 0, stopped = 0, failed = 0, cancelled = 0;
  for (const wire::TrialInfo& t : report.trials()) {
    succeeded += t.job_state() == wire::JOB_SUCCEEDED;
    stopped += t.job_state() == wire::JOB_STOPPED;
    failed += t.job_state() == wire::JOB_FAILED;
    cancelled += t.job_state() == wire::JOB_CANCELLED;
  }
  std::string summary = std::to_string(report.trials_size()) + " trials: " + std::to_string(succeeded) +
                        " succeeded, " + std::to_string(stopped) + " stopped by the search, " + std::to_string(failed) +
                        " failed, " + std::to_string(cancelled) + " cancelled";
  if (report.best_trial() > 0) {
    const wire::TrialInfo& best = report.trials(report.best_trial() - 1);
    summary += "; best: trial " + std::to_string(best.trial()) + " (job " + std::to_string(best.job_id()) + "), " +
               report.metric() + " " + MetricText(best.best());
  }
  const bool any = succeeded + stopped > 0;
  StateStore::Transaction transaction(store_);
  store_.SetState(search.id, any ? JobState::kSucceeded : JobState::kFailed, any ? "" : "no trial succeeded", now);
  store_.AddEvent(search.id, "search ended: " + summary, now);
  transaction.Commit();
  WriteCsv(search.id);
  spdlog::info("search {} ended: {}", search.id, summary);
}

int SearchDriver::Judge(int64_t job, int epoch, const std::string& csv_header, const std::string& csv_line,
                        double now) {
  const auto trial = store_.TrialOfJob(job);
  if (!trial) return 0;
  if (trial->stopped_at > 0) return trial->stopped_at;
  const auto search = store_.FindSearch(trial->search);
  if (!search || std::find(search->rungs.begin(), search->rungs.end(), epoch) == search->rungs.end()) return 0;
  const std::vector<RungResult> earlier = store_.RungResults(trial->search, epoch);
  for (const RungResult& r : earlier)
    if (r.trial == trial->trial) return r.promoted ? 0 : epoch;  // judged already
  const double value = MetricOf(csv_header, csv_line, search->metric);
  const bool promoted = AshaPromotes(earlier, value, search->maximize, search->eta);
  store_.AddRungResult(trial->search, epoch, {trial->trial, value, promoted}, now);
  const size_t keep = std::max<size_t>(1, (earlier.size() + 1) / size_t(search->eta));
  const std::string verdict = search->metric + " " + MetricText(value) + " at epoch " + std::to_string(epoch) +
                              (promoted ? " is" : " is not") + " among the best " + std::to_string(keep) + " of " +
                              std::to_string(earlier.size() + 1) +
                              " at this rung: " + (promoted ? "it goes on" : "stopped by the search");
  store_.AddEvent(job, "search " + std::to_string(trial->search) + ": " + verdict, now);
  store_.AddEvent(trial->search,
                  "trial " + std::to_string(trial->trial) + " (job " + std::to_string(job) + "): " + verdict, now);
  if (promoted) return 0;
  store_.SetTrialStopped(trial->search, trial->trial, epoch);
  return epoch;
}

void SearchDriver::Cancel(const JobRecord& search, const ClientIdentity& client, const std::string& who, double now) {
  if (search.state != JobState::kRunning) return;
  StateStore::Transaction transaction(store_);
  store_.SetState(search.id, JobState::kCancelled, "cancelled by " + who, now);
  store_.AddEvent(search.id, "cancelled by " + who + ", with its trials not yet ended", now);
  transaction.Commit();
  for (const TrialRecord& t : store_.Trials(search.id)) {
    const auto job = t.job ? store_.Find(t.job) : std::nullopt;
    if (job && !Ended(job->state)) loop_.CancelTrial(t.job, client);
  }
  WriteCsv(search.id);
  spdlog::info("search {} cancelled", search.id);
}

// Writing it reads every trial, so a change to one trial only marks it stale (MarkStale),
// and the next Advance (within 2 s) rewrites it once; the search's end and cancel write
// it at once.
void SearchDriver::WriteCsv(int64_t search) {
  stale_csvs_.erase(search);
  wire::SearchReport report;
  views_.FillSearchReport(search, &report);
  std::string text = "trial,job,name,state,epochs,stopped_at,best_" + report.metric() + ",rank_seconds,model_dir";
  const wire::TrialInfo* first = report.trials_size() ? &report.trials(0) : nullptr;
  if (first)
    for (const std::string& p : first->params()) text += "," + Cell(p.substr(0, p.find('=')));
  text += "\n";
  for (const wire::TrialInfo& t : report.trials()) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", t.rank_seconds());
    text += std::to_string(t.trial()) + "," + std::to_string(t.job_id()) + "," + Cell(t.name()) + "," +
            (t.job_id() ? JobStateName(t.job_state()) : std::string("PENDING")) + "," + std::to_string(t.curve_size()) +
            "," + std::to_string(t.stopped_at()) + "," + (std::isnan(t.best()) ? std::string() : MetricText(t.best())) +
            "," + seconds + "," + Cell(t.model_dir());
    for (const std::string& p : t.params()) text += "," + Cell(p.substr(p.find('=') + 1));
    text += "\n";
  }
  loop_.WriteRunsFile(search, "search.csv", text);
}

}  // namespace trainyard
