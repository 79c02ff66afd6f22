// A search's submission, and stopping its trials, on the coordinator's loop (Note [Search
// life cycle] and Note [ASHA] in coordinator/search.h; the rest in search_driver.cc).
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
    searches_->MarkDue();
  }
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  reply.mutable_submitted()->set_job_id(record.id);
  reply.mutable_submitted()->set_created(created);
  Send(parsed.identity, reply);
}

void Server::StopTrial(int64_t job, int attempt, int epoch) {
  searches_->MarkDue();
  if (RunningAttempt* running = running_.Find(job)) {
    if (running->attempt != attempt || running->search_stop_at != 0) return;
    running->search_stop_at = epoch;
    SendSearchStop(*running);
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
  searches_->MarkStale(record->search);
}

}  // namespace trainyard
