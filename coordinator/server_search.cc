// Hyperparameter searches on the coordinator's loop: Note [Search life cycle] and
// Note [ASHA] in coordinator/search.h.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/bounded_json.h"
#include "common/regular_file.h"
#include "coordinator/search.h"
#include "coordinator/server.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

using json = nlohmann::json;

bool Ended(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled ||
         state == JobState::kStopped;
}

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

TrialRecord TrialFrom(const SearchTrial& trial, const SearchSpec& spec) {
  TrialRecord t;
  t.trial = trial.index;
  t.name = trial.spec.name;
  json params = json::array();
  for (const auto& [key, value] : trial.params) params.push_back({key, value});
  t.params_json = params.dump();
  t.yaml = trial.yaml;
  t.base_dir = spec.base_dir;
  t.source = spec.source + " trial " + std::to_string(trial.index);
  const ResourcesSpec& r = trial.spec.resources;
  t.job_fields.priority = r.priority;
  t.job_fields.ranks = r.ranks;
  t.job_fields.max_restarts = r.max_restarts;
  t.job_fields.device = r.device;
  t.job_fields.estimate_s = r.estimate_minutes * 60.0;
  t.job_fields.preemptible = r.preemptible;
  return t;
}

SearchRecord RecordOf(const SearchSpec& spec, int64_t job) {
  SearchRecord r;
  r.job = job;
  r.method = ToString(spec.method);
  r.metric = spec.metric;
  r.maximize = spec.maximize;
  r.eta = spec.asha.reduction_factor;
  r.max_epochs = spec.method == SearchMethod::kAsha ? spec.asha.max_epochs : spec.trials.front().spec.train.epochs;
  r.max_concurrent = spec.max_concurrent;
  if (spec.method == SearchMethod::kAsha) r.rungs = spec.asha.Rungs();
  return r;
}

// A CSV cell: the rows Trainyard writes hold no comma (common/csv.h).
std::string Cell(std::string text) {
  std::replace(text.begin(), text.end(), ',', ';');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

std::string Server::SearchPolicyRefusal(const SearchSpec& spec, bool admin) const {
  for (const SearchTrial& t : spec.trials)
    if (std::string refusal = PolicyRefusal(admin, t.spec.resources.priority, t.spec.resources.preemptible);
        !refusal.empty())
      return refusal;
  return "";
}

void Server::FinishSearchSubmission(const ParsedSubmission& parsed) {
  const SearchSpec& spec = *parsed.search;
  const wire::SubmitRequest& request = parsed.request;
  NewJob job;
  job.name = spec.name;
  job.idempotency_key = request.idempotency_key();
  job.spec_yaml = request.yaml();
  job.source = request.source();
  job.base_dir = request.base_dir();
  job.user = PlainUser(request.user());
  job.ranks = 0;
  job.max_restarts = 0;
  job.is_search = true;
  int most_ranks = 0;
  for (const SearchTrial& t : spec.trials) most_ranks = std::max(most_ranks, t.spec.resources.ranks);
  if (const std::string refusal = SearchPolicyRefusal(spec, parsed.admin); !refusal.empty()) {
    Send(parsed.identity, ErrorEnvelope(2, "refused: " + refusal));
    return;
  }
  job.priority = spec.trials.front().spec.resources.priority;
  job.device = spec.trials.front().spec.resources.device;
  const std::string over_quota = SearchQuotaRefusal(job.user, spec.max_concurrent, most_ranks);
  const double now = Now();
  bool created = false;
  StateStore::Transaction transaction(*store_);
  const JobRecord record = store_->Submit(job, now, &created);
  if (created && !over_quota.empty()) {  // rolled back: a refused submission changes nothing
    Send(parsed.identity, ErrorEnvelope(2, "refused: " + over_quota));
    return;
  }
  if (!created && record.spec_yaml != job.spec_yaml) {
    Send(parsed.identity, ErrorEnvelope(2, KeyReuseRefusal(job.idempotency_key, record)));
    return;
  }
  if (created) {
    std::vector<TrialRecord> trials;
    for (const SearchTrial& t : spec.trials) trials.push_back(TrialFrom(t, spec));
    store_->SetState(record.id, JobState::kRunning, "", now);
    store_->AddSearch(RecordOf(spec, record.id), trials);
    store_->AddEvent(record.id,
                     "search submitted by " + (record.user.empty() ? std::string("an unnamed user") : record.user) +
                         ": " + std::to_string(trials.size()) + " trials, method " + ToString(spec.method) + ", " +
                         (spec.maximize ? "maximizing " : "minimizing ") + spec.metric + ", at most " +
                         std::to_string(spec.max_concurrent) + " at once",
                     now);
  }
  transaction.Commit();  // before the reply
  if (created) {
    spdlog::info("search {} '{}' accepted: {} trials ({})", record.id, record.name, spec.trials.size(),
                 ToString(spec.method));
    search_due_ = true;
  }
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  reply.mutable_submitted()->set_job_id(record.id);
  reply.mutable_submitted()->set_created(created);
  Send(parsed.identity, reply);
}

// On every change that may end a trial, and every 2 s besides, so that no way a trial
// ends can leave its search waiting.
void Server::AdvanceSearches(double now) {
  if (!search_due_ && now - last_search_pass_ < 2) return;
  search_due_ = false;
  last_search_pass_ = now;
  for (const JobRecord& job : store_->JobsIn(JobState::kRunning))
    if (job.is_search) AdvanceSearch(job, now);
  for (int64_t search : std::exchange(stale_search_csvs_, {})) WriteSearchCsv(search);
}

void Server::AdvanceSearch(const JobRecord& search, double now) {
  const auto record = store_->FindSearch(search.id);
  if (!record) return;
  const std::vector<TrialRecord> trials = store_->Trials(search.id);
  int active = 0;
  bool all_ended = true;
  for (const TrialRecord& t : trials) {
    if (t.job == 0) {
      all_ended = false;
      continue;
    }
    const auto job = store_->Find(t.job);
    if (job && !Ended(job->state)) {
      ++active;
      all_ended = false;
    }
  }
  if (all_ended) return FinishSearch(search, now);
  // Under --user-max-queued, trials wait while their user's queue is full.
  const int queue_limit = options_.policy.user_max_queued;
  int queued = queue_limit > 0 ? QueuedJobsOf(search.user) : 0;
  for (const TrialRecord& t : trials) {
    if (active >= record->max_concurrent || (queue_limit > 0 && queued >= queue_limit)) break;
    if (t.job != 0) continue;
    SubmitTrial(search, t, now);
    ++active;
    ++queued;
  }
}

// The trial's job and the trial's record of it commit together, so a restart can neither
// lose a trial nor submit one twice.
void Server::SubmitTrial(const JobRecord& search, const TrialRecord& trial, double now) {
  NewJob job = trial.job_fields;
  job.name = trial.name;
  job.spec_yaml = trial.yaml;
  job.source = trial.source;
  job.base_dir = trial.base_dir;
  job.user = search.user;
  job.search = search.id;
  bool created = false;
  StateStore::Transaction transaction(*store_);
  const JobRecord record = store_->Submit(job, now, &created);
  store_->SetTrialJob(search.id, trial.trial, record.id);
  const std::string params = ParamsText(trial.params_json);
  store_->AddEvent(record.id,
                   "submitted by search " + std::to_string(search.id) + " as trial " + std::to_string(trial.trial) +
                       " (" + params + ") for " + (search.user.empty() ? std::string("an unnamed user") : search.user),
                   now);
  store_->AddEvent(
      search.id,
      "trial " + std::to_string(trial.trial) + " (" + params + ") submitted as job " + std::to_string(record.id), now);
  transaction.Commit();
  spdlog::info("search {}: trial {} queued as job {}", search.id, trial.trial, record.id);
  schedule_due_ = true;
  stale_search_csvs_.insert(search.id);
}

void Server::FinishSearch(const JobRecord& search, double now) {
  wire::SearchReport report;
  views_->FillSearchReport(search.id, &report);
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
  StateStore::Transaction transaction(*store_);
  store_->SetState(search.id, any ? JobState::kSucceeded : JobState::kFailed, any ? "" : "no trial succeeded", now);
  store_->AddEvent(search.id, "search ended: " + summary, now);
  transaction.Commit();
  WriteSearchCsv(search.id);
  spdlog::info("search {} ended: {}", search.id, summary);
}

int Server::JudgeTrialEpoch(int64_t job, int epoch, const std::string& csv_header, const std::string& csv_line,
                            double now) {
  const auto trial = store_->TrialOfJob(job);
  if (!trial) return 0;
  if (trial->stopped_at > 0) return trial->stopped_at;
  const auto search = store_->FindSearch(trial->search);
  if (!search || std::find(search->rungs.begin(), search->rungs.end(), epoch) == search->rungs.end()) return 0;
  const std::vector<RungResult> earlier = store_->RungResults(trial->search, epoch);
  for (const RungResult& r : earlier)
    if (r.trial == trial->trial) return r.promoted ? 0 : epoch;  // judged already
  const double value = MetricOf(csv_header, csv_line, search->metric);
  const bool promoted = AshaPromotes(earlier, value, search->maximize, search->eta);
  store_->AddRungResult(trial->search, epoch, {trial->trial, value, promoted}, now);
  const size_t keep = std::max<size_t>(1, (earlier.size() + 1) / size_t(search->eta));
  const std::string verdict = search->metric + " " + MetricText(value) + " at epoch " + std::to_string(epoch) +
                              (promoted ? " is" : " is not") + " among the best " + std::to_string(keep) + " of " +
                              std::to_string(earlier.size() + 1) +
                              " at this rung: " + (promoted ? "it goes on" : "stopped by the search");
  store_->AddEvent(job, "search " + std::to_string(trial->search) + ": " + verdict, now);
  store_->AddEvent(trial->search,
                   "trial " + std::to_string(trial->trial) + " (job " + std::to_string(job) + "): " + verdict, now);
  if (promoted) return 0;
  store_->SetTrialStopped(trial->search, trial->trial, epoch);
  return epoch;
}

void Server::StopTrial(int64_t job, int attempt, int epoch) {
  search_due_ = true;
  auto it = running_.find(job);
  if (it != running_.end()) {
    if (it->second.attempt != attempt || it->second.search_stop_at != 0) return;
    it->second.search_stop_at = epoch;
    SendSearchStop(it->second);
    return;
  }
  const auto record = store_->Find(job);
  if (record && record->state == JobState::kQueued) EndStoppedTrial(job, epoch);  // its attempt ended meanwhile
}

void Server::SendSearchStop(const RunningAttempt& attempt) {
  const RankEntry* lead = ranks_->Find(attempt.slots.front());
  if (!lead || lead->identity.empty()) return;  // re-adoption sends it again
  wire::Envelope e;
  wire::StopJob* stop = e.mutable_stop();
  stop->set_job_id(attempt.job);
  stop->set_attempt(attempt.attempt);
  stop->set_reason("stopped by its search at epoch " + std::to_string(attempt.search_stop_at));
  Send(lead->identity, e);
}

void Server::EndStoppedTrial(int64_t job, int epoch) {
  const auto record = store_->Find(job);
  if (!record || Ended(record->state)) return;
  const std::string why = "stopped by search " + std::to_string(record->search) + " at epoch " + std::to_string(epoch) +
                          " (Note [ASHA]: not among the best at that rung)";
  EndJobsAttempt(job, {wire::OUTCOME_STOPPED, why, JobState::kStopped, why, 0, why,
                       "the trial was stopped by its search: this slot is free"});
  spdlog::info("job {} {}", job, why);
  stale_search_csvs_.insert(record->search);
}

// The search ends first, so that a crash midway leaves no search submitting trials;
// then each trial not yet ended is cancelled as its owner's cancel would.
wire::Envelope Server::CancelSearch(const JobRecord& search, const ClientIdentity& client) {
  if (search.state != JobState::kRunning) return views_->Status(search.id);
  const double now = Now();
  StateStore::Transaction transaction(*store_);
  store_->SetState(search.id, JobState::kCancelled, "cancelled by " + Who(client), now);
  store_->AddEvent(search.id, "cancelled by " + Who(client) + ", with its trials not yet ended", now);
  transaction.Commit();
  for (const TrialRecord& t : store_->Trials(search.id)) {
    const auto job = t.job ? store_->Find(t.job) : std::nullopt;
    if (job && !Ended(job->state)) Cancel(t.job, client);
  }
  WriteSearchCsv(search.id);
  spdlog::info("search {} cancelled", search.id);
  return views_->Status(search.id);
}

// runs/<search id>/search.csv: a row per trial. Writing it reads every trial, so a change
// to one trial (submitted, a new epoch row, stopped) only marks it stale, and the next
// search pass (within 2 s) rewrites it once; the search's end writes it at once.
void Server::WriteSearchCsv(int64_t search) {
  stale_search_csvs_.erase(search);
  wire::SearchReport report;
  views_->FillSearchReport(search, &report);
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
  WriteJobFile(JobRunsDir(search), "search.csv", text, search);
}

}  // namespace trainyard
