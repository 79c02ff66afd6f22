// jobctl's read requests, answered from the loop's state (coordinator/job_views.h).
#include "coordinator/job_views.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/bounded_json.h"
#include "common/csv.h"
#include "common/regular_file.h"
#include "coordinator/search.h"
#include "coordinator/server.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

using json = nlohmann::json;

void Fill(const JobRecord& j, wire::JobInfo* info) {
  info->set_id(j.id);
  info->set_name(j.name);
  info->set_job_state(ToWire(j.state));
  info->set_priority(j.priority);
  info->set_ranks(j.ranks);
  info->set_device(j.device);
  info->set_attempts(j.attempts);
  info->set_reason(j.reason);
  info->set_submitted_at(j.submitted_at);
  info->set_user(j.user);
  info->set_preemptible(j.preemptible);
  info->set_is_search(j.is_search);
  info->set_search_id(j.search);
}

// The listeners a running serve job wrote to its endpoints.json (serve_frontend does, once
// bound), as (protocol, URL) pairs: ("http", "http://127.0.0.1:8000"); none if there is no
// such file or it is not what serve_frontend writes. A regular file of at most 64 KiB:
// read on the loop.
std::vector<std::pair<std::string, std::string>> ServeEndpoints(const std::string& runs_dir,
                                                                const std::string& relative) {
  const FileRead read = ReadFileBeneath(runs_dir, relative, size_t(64) << 10);
  if (!read.ok()) return {};
  const nlohmann::json endpoints = ParseBoundedJsonOrDiscarded(read.bytes);
  std::vector<std::pair<std::string, std::string>> out;
  if (!endpoints.is_object()) return out;
  for (const char* kind : {"http", "grpc", "metrics"})
    if (endpoints.contains(kind) && endpoints[kind].is_string()) out.emplace_back(kind, endpoints[kind]);
  return out;
}

// Note [A job's metric]: the metrics tried after the one a job names, in order, from its
// newest epoch row's header.
std::vector<std::string> FallbackMetrics(const std::string& csv_header) {
  std::vector<std::string> out;
  for (const std::string& column : SplitCsv(csv_header))
    if (column.rfind("eval_", 0) == 0 && column != "eval_loss") out.push_back(column);
  out.push_back("eval_loss");
  out.push_back("train_loss");
  return out;
}

// A listing's states as the store names them; an unknown or unset one is bad input.
std::vector<JobState> StatesFromWire(const google::protobuf::RepeatedField<int>& states) {
  std::vector<JobState> out;
  for (int wire_state : states) {
    bool known = false;
    for (JobState state : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
                           JobState::kCancelled, JobState::kStopped})
      if (int(ToWire(state)) == wire_state) {
        out.push_back(state);
        known = true;
      }
    if (!known)
      throw std::invalid_argument("a listing asked for job state " + std::to_string(wire_state) +
                                  ", which is none of QUEUED, RUNNING, SUCCEEDED, FAILED, "
                                  "CANCELLED and STOPPED");
  }
  return out;
}

}  // namespace

wire::JobState ToWire(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return wire::JOB_QUEUED;
    case JobState::kRunning:
      return wire::JOB_RUNNING;
    case JobState::kSucceeded:
      return wire::JOB_SUCCEEDED;
    case JobState::kFailed:
      return wire::JOB_FAILED;
    case JobState::kCancelled:
      return wire::JOB_CANCELLED;
    case JobState::kStopped:
      return wire::JOB_STOPPED;
  }
  return wire::JOB_STATE_UNSPECIFIED;
}

JobViews::JobViews(Sources sources, Settings settings) : sources_(sources), settings_(std::move(settings)) {}

std::string JobViews::WaitingText(const JobRecord& job) const {
  if (job.state != JobState::kQueued) return "";
  auto it = sources_.waiting.find(std::to_string(job.id));
  if (it != sources_.waiting.end()) return it->second;
  // Under --slurm no pass fills waiting_, and Slurm, not a pool, runs the job.
  return sources_.ranks.empty() && !settings_.slurm ? "Resources: no pool agent is registered"
                                                    : "Pending: not yet considered by the scheduler";
}

wire::Envelope JobViews::List(const wire::ListRequest& request) const {
  JobFilter filter;
  try {
    filter.states = StatesFromWire(request.states());
  } catch (const std::invalid_argument& e) {
    return ErrorEnvelope(2, e.what());
  }
  if (request.limit() < 0) return ErrorEnvelope(2, "a listing's limit must be 0 (no limit) or more");
  if (request.before_id() < 0) return ErrorEnvelope(2, "a listing's before_id must be 0 (none) or more");
  filter.user = request.user();
  filter.name_contains = request.name_contains();
  filter.before_id = request.before_id();
  // One job past the page says whether there is a next one (ListReply in trainyard.proto).
  const int64_t most = settings_.list_page;
  const int64_t page = request.limit() > 0 ? std::min<int64_t>(request.limit(), most) : most;
  filter.limit = page + 1;
  std::vector<JobRecord> matched = sources_.store.JobsMatching(filter);
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  wire::ListReply* jobs = reply.mutable_jobs();  // set even when empty: it is the reply's body
  if (int64_t(matched.size()) > page) {
    matched.pop_back();
    jobs->set_next_before_id(matched.back().id);
  }
  std::map<int64_t, std::string> search_metrics;  // a search's metric, once per listing
  for (const JobRecord& j : matched) {
    wire::JobInfo* info = jobs->add_jobs();
    Fill(j, info);
    info->set_waiting(WaitingText(j));
    FillMetric(j, &search_metrics, info);
  }
  return reply;
}

void JobViews::FillMetric(const JobRecord& job, std::map<int64_t, std::string>* search_metrics,
                          wire::JobInfo* info) const {
  if (job.is_search) {
    wire::SearchReport search;
    FillSearchReport(job.id, &search);
    if (search.best_trial() > 0) {
      info->set_metric(search.metric());
      info->set_metric_value(search.trials(search.best_trial() - 1).best());
    }
    return;
  }
  std::string metric = job.metric;
  if (job.search != 0) {
    auto known = search_metrics->find(job.search);
    if (known == search_metrics->end()) {
      const auto search = sources_.store.FindSearch(job.search);
      known = search_metrics->emplace(job.search, search ? search->metric : "").first;
    }
    metric = known->second;
  }
  // Most jobs' metric is in their newest row; an older row is read only where it is not.
  const auto newest = sources_.store.NewestRowWith(job.id, "epoch");
  if (!newest) return;
  std::vector<std::string> candidates = FallbackMetrics(newest->csv_header);
  if (!metric.empty()) candidates.insert(candidates.begin(), metric);
  for (const std::string& name : candidates) {
    double value = MetricOf(newest->csv_header, newest->csv_line, name);
    if (std::isnan(value)) {
      const auto row = sources_.store.NewestRowWith(job.id, name);
      if (row) value = MetricOf(row->csv_header, row->csv_line, name);
    }
    if (std::isnan(value)) continue;
    info->set_metric(name);
    info->set_metric_value(value);
    return;
  }
}

wire::Envelope JobViews::Status(int64_t id) const {
  auto job = sources_.store.Find(id);
  if (!job) return ErrorEnvelope(2, "no job " + std::to_string(id));
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  wire::JobInfo* info = reply.mutable_job();
  Fill(*job, info);
  info->set_waiting(WaitingText(*job));
  std::map<int64_t, std::string> search_metrics;
  FillMetric(*job, &search_metrics, info);
  info->set_slurm(SlurmText(id));
  for (const EventRecord& event : sources_.store.TimedEvents(id)) {
    info->add_events(event.text);
    info->add_event_times(event.at);
  }
  if (job->state == JobState::kRunning)
    for (const auto& [protocol, url] :
         ServeEndpoints(settings_.runs_dir, std::to_string(id) + "/" + job->name + "/endpoints.json")) {
      info->add_endpoints(protocol + " " + url);
      wire::Endpoint* listener = info->add_listeners();
      listener->set_protocol(protocol);
      listener->set_url(url);
    }
  return reply;
}

wire::Envelope JobViews::Report(int64_t id) const {
  wire::Envelope status = Status(id);
  if (status.has_error()) return status;
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  wire::ReportReply* report = reply.mutable_job_report();
  *report->mutable_job() = status.job();
  for (const AttemptRecord& a : sources_.store.Attempts(id)) {
    wire::AttemptInfo* info = report->add_attempts();
    info->set_attempt(a.attempt);
    info->set_placement(a.placement);
    info->set_started_at(a.started_at);
    info->set_ended_at(a.ended_at);
    info->set_rank_seconds(a.RankSeconds(Now()));
    info->set_gpu_seconds(a.GpuSeconds(Now()));
    info->set_end(a.end);
    info->set_end_reason(a.end_reason);
  }
  for (const EpochRecord& row : sources_.store.EpochRows(id)) {
    if (report->csv_header().empty()) report->set_csv_header(row.csv_header);
    report->add_csv_lines(row.csv_line);
    report->add_row_attempts(row.attempt);
  }
  const FileRead summary = ReadFileBeneath(settings_.runs_dir, std::to_string(id) + "/summary.json", kMaxSummaryBytes);
  if (summary.ok()) report->set_summary_json(summary.bytes);
  if (status.job().is_search()) FillSearchReport(id, report->mutable_search());
  return reply;
}

wire::Envelope JobViews::UsageReport(bool per_user) const {
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  wire::UsageReply* rows = reply.mutable_usage_rows();  // set even when empty: it is the reply's body
  const double now = Now();
  const std::map<std::string, double> decayed = sources_.store.DecayedRankSeconds(now, settings_.fairshare_half_life_s);
  std::map<std::string, int> running_ranks, queued;
  for (const auto& [id, attempt] : sources_.running)
    running_ranks[per_user ? attempt.user : ""] += int(attempt.slots.size());
  for (const auto& [id, j] : sources_.store.Queued()) ++queued[per_user ? j.user : ""];
  for (const Usage& u : sources_.store.UsageBy(per_user, now)) {
    wire::UsageRow* row = rows->add_rows();
    row->set_user(u.user);
    row->set_jobs(u.jobs);
    row->set_attempts(u.attempts);
    row->set_rank_seconds(u.rank_seconds);
    row->set_gpu_seconds(u.gpu_seconds);
    double fairshare = 0;
    for (const auto& [user, seconds] : decayed) fairshare += (!per_user || user == u.user) ? seconds : 0;
    row->set_fairshare_rank_seconds(fairshare);
    row->set_running_ranks(running_ranks[u.user]);
    row->set_queued_jobs(queued[u.user]);
  }
  return reply;
}

wire::Envelope JobViews::Workers() const {
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  wire::WorkersReply* list = reply.mutable_worker_list();
  for (const auto& [key, entry] : sources_.ranks.entries()) {
    wire::WorkerInfo* info = list->add_workers();
    *info->mutable_rank() = entry.info;
    info->set_job_id(entry.job);
    info->set_attempt(entry.attempt);
    info->set_seen_ago_s(sources_.ranks.SilentFor(entry));
    info->set_last_log_line(entry.last_log_line);
  }
  return reply;
}

wire::Envelope JobViews::Logs(const wire::LogsRequest& request) const {
  auto job = sources_.store.Find(request.job_id());
  if (!job) return ErrorEnvelope(2, "no job " + std::to_string(request.job_id()));
  if (request.output()) return OutputLogs(*job, request);
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  reply.mutable_log_rows();
  auto rows = sources_.store.EpochRows(request.job_id());
  for (size_t i = static_cast<size_t>(std::max(0, request.after())); i < rows.size(); ++i)
    reply.mutable_log_rows()->add_csv_lines(rows[i].csv_line);
  if (!rows.empty()) reply.mutable_log_rows()->set_csv_header(rows.front().csv_header);
  reply.mutable_log_rows()->set_job_state(ToWire(job->state));
  reply.mutable_log_rows()->set_reason(job->reason);
  return reply;
}

// Note [Job output]: the latest attempt unless one is named; bad input for one the job
// has not had.
wire::Envelope JobViews::OutputLogs(const JobRecord& job, const wire::LogsRequest& request) const {
  const int attempt = request.attempt() > 0 ? request.attempt() : job.attempts;
  if (attempt > job.attempts)
    return ErrorEnvelope(2, "job " + std::to_string(job.id) + " has had " + std::to_string(job.attempts) +
                                " attempt(s), not " + std::to_string(attempt));
  if (request.offset() < 0) return ErrorEnvelope(2, "a negative output offset");
  if (request.has_rank() && request.rank() < 0) return ErrorEnvelope(2, "a negative rank");
  wire::Envelope reply;
  reply.set_version(kProtocolVersion);
  wire::LogsReply* logs = reply.mutable_log_rows();
  logs->set_job_state(ToWire(job.state));
  logs->set_reason(job.reason);
  logs->set_attempt(attempt);
  logs->set_attempts(job.attempts);
  if (attempt == 0) return reply;
  const OutputRead read = sources_.outputs.Read(job.id, attempt, request.offset(), kMaxOutputReadBytes,
                                                request.has_rank() ? request.rank() : -1);
  logs->set_output(read.text);
  logs->set_output_offset(read.next_offset);
  logs->set_output_restarted(read.restarted);
  return reply;
}

void JobViews::FillSearchReport(int64_t search_id, wire::SearchReport* out) const {
  const auto search = sources_.store.FindSearch(search_id);
  if (!search) return;
  out->set_method(search->method);
  out->set_metric(search->metric);
  out->set_maximize(search->maximize);
  for (int r : search->rungs) out->add_rungs(r);
  out->set_max_epochs(search->max_epochs);
  out->set_max_concurrent(search->max_concurrent);
  const double now = Now(), nan = std::numeric_limits<double>::quiet_NaN();
  double best = nan;
  for (const TrialRecord& t : sources_.store.Trials(search_id)) {
    wire::TrialInfo* info = out->add_trials();
    info->set_trial(t.trial);
    info->set_name(t.name);
    info->set_job_id(t.job);
    info->set_stopped_at(t.stopped_at);
    const json params = ParseBoundedJsonOrDiscarded(t.params_json);
    if (params.is_array())
      for (const json& p : params)
        if (p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_string())
          info->add_params(p[0].get<std::string>() + "=" + p[1].get<std::string>());
    info->set_best(nan);
    const auto job = t.job ? sources_.store.Find(t.job) : std::nullopt;
    if (!job) continue;
    info->set_job_state(ToWire(job->state));
    double seconds = 0;
    for (const AttemptRecord& a : sources_.store.Attempts(t.job)) seconds += a.RankSeconds(now);
    info->set_rank_seconds(seconds);
    double trial_best = nan;
    for (const EpochRecord& row : sources_.store.EpochRows(t.job)) {
      const double value = MetricOf(row.csv_header, row.csv_line, search->metric);
      info->add_curve(value);
      if ((t.stopped_at == 0 || row.epoch <= t.stopped_at) && Better(value, trial_best, search->maximize))
        trial_best = value;
    }
    info->set_best(trial_best);
    if (job->state != JobState::kSucceeded) continue;
    const FileRead summary =
        ReadFileBeneath(settings_.runs_dir, std::to_string(t.job) + "/summary.json", kMaxSummaryBytes);
    const json parsed = summary.ok() ? ParseBoundedJsonOrDiscarded(summary.bytes) : json();
    if (parsed.is_object() && parsed.contains("model_dir") && parsed["model_dir"].is_string())
      info->set_model_dir(parsed["model_dir"].get<std::string>());
    if (Better(trial_best, best, search->maximize)) {
      best = trial_best;
      out->set_best_trial(t.trial);
    }
  }
}

std::string JobViews::SlurmText(int64_t id) const {
  const auto it = sources_.running.find(id);
  if (it == sources_.running.end() || it->second.slurm_job.empty()) return "";
  const RunningAttempt& attempt = it->second;
  const auto describe = [](const SlurmJobState& s) { return s.state.empty() ? "submitted" : s.Describe(); };
  if (!attempt.elastic) return "job " + attempt.slurm_job + ": " + describe(attempt.slurm_state);
  std::string text;  // each live replica's own Slurm job
  for (const RankKey& slot : attempt.slots) {
    if (attempt.finished.count(slot)) continue;
    const auto state = attempt.replica_slurm_states.find(slot);
    text += std::string(text.empty() ? "jobs " : ", ") + SlurmJobOfWorld(slot.first) + ": " +
            describe(state == attempt.replica_slurm_states.end() ? SlurmJobState{} : state->second);
  }
  return text;
}

}  // namespace trainyard
