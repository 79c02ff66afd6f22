// The dashboard's read-only JSON API and the Prometheus metrics, answered on the loop
// thread (Note [Dashboard queries] in server.h). Every answer is built from the store
// and the rank registry at the moment it is asked, so it says what jobctl would.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "common/bounded_json.h"
#include "common/csv.h"
#include "common/metrics.h"
#include "common/query_string.h"
#include "common/regular_file.h"
#include "coordinator/job_views.h"
#include "coordinator/search_json.h"
#include "proto/wire_names.h"

namespace trainyard {
namespace {

using json = nlohmann::json;

constexpr size_t kDashboardOutputBytes = 16 << 10;  // of a job's output on its page

WebReply JsonReply(int status, const json& body) { return {status, "application/json", DumpJsonForPeer(body)}; }
WebReply NotFound(const std::string& what) { return JsonReply(404, {{"error", what}}); }

constexpr int64_t kMaxJobId = 999'999'999'999'999'999;  // 18 digits

// A job id as a path segment: 1 to 18 digits, nothing else.
std::optional<int64_t> ParseJobId(const std::string& text) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (text.empty() || text.size() > 18 || !std::all_of(text.begin(), text.end(), digit)) return std::nullopt;
  return std::stoll(text);
}

json JobJson(const JobRecord& j) {
  return {{"id", j.id},
          {"name", j.name},
          {"state", ToString(j.state)},
          {"priority", j.priority},
          {"ranks", j.ranks},
          {"device", j.device},
          {"attempts", j.attempts},
          {"max_restarts", j.max_restarts},
          {"reason", j.reason},
          {"user", j.user},
          {"submitted_at", j.submitted_at},
          {"preemptible", j.preemptible},
          {"kind", j.is_search ? "search" : "job"},
          {"search", j.search}};
}

// One epochs.csv row as {column: value}: numbers as numbers, empty cells as null.
json EpochJson(const std::vector<std::string>& header, const EpochRecord& row) {
  const std::vector<std::string> cells = SplitCsv(row.csv_line);
  json out = {{"attempt", row.attempt}};
  for (size_t i = 0; i < header.size() && i < cells.size(); ++i) {
    const std::string& cell = cells[i];
    char* end = nullptr;
    const double number = std::strtod(cell.c_str(), &end);
    if (cell.empty())
      out[header[i]] = nullptr;
    else if (end == cell.c_str() + cell.size() && std::isfinite(number))
      out[header[i]] = number;
    else
      out[header[i]] = cell;
  }
  return out;
}

// A job's newest epoch row, parsed; null if it has none.
json LatestEpoch(const std::optional<EpochRecord>& newest) {
  if (!newest) return nullptr;
  return EpochJson(SplitCsv(newest->csv_header), *newest);
}

// Note [Paged job listing]
// GET /api/jobs answers one page of jobs, newest first: at most `limit` (default
// kDefaultJobPage, at most kMaxJobPage), optionally only those older than job `before`,
// in states `state` (comma-separated) or of owner `user`. Each job costs the loop a row
// and its newest epoch row, so a page costs the same with 20 jobs stored or 20 million.
// The reply's `next` is the URL of the following page (null on the last one) and
// `total` counts the jobs the filters match on every page. Ids only grow, so paging by
// id never shows a job twice or skips one, however many are submitted meanwhile.
constexpr int64_t kDefaultJobPage = 200, kMaxJobPage = 1000;

// A bad query is the client's mistake: 400, naming the field and what it takes.
struct BadQuery : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

int64_t WholeNumberIn(const std::string& field, const std::string& text, int64_t low, int64_t high) {
  const std::optional<int64_t> number = ParseJobId(text);  // 1 to 18 digits
  if (!number || *number < low || *number > high)
    throw BadQuery(field + ": expected a whole number from " + std::to_string(low) + " to " + std::to_string(high) +
                   ", got '" + text.substr(0, 32) + "'");
  return *number;
}

std::vector<JobState> StatesIn(const std::string& text) {
  std::vector<JobState> states;
  std::stringstream names(text);
  for (std::string name; std::getline(names, name, ',');) {
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
    try {
      states.push_back(JobStateFromString(name));
    } catch (const StoreError&) {
      throw BadQuery(
          "state: expected QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED or STOPPED (comma-separated), "
          "got '" +
          name.substr(0, 32) + "'");
    }
  }
  return states;
}

// The filter a GET /api/jobs asks for; throws BadQuery.
JobFilter JobPageFilter(const std::string& target) {
  std::map<std::string, std::string> fields;
  try {
    fields = ParseQueryString(target);
  } catch (const QueryError& e) {
    throw BadQuery(e.what());
  }
  JobFilter filter;
  filter.limit = fields.count("limit") ? WholeNumberIn("limit", fields["limit"], 1, kMaxJobPage) : kDefaultJobPage;
  if (fields.count("before")) filter.before_id = WholeNumberIn("before", fields["before"], 1, kMaxJobId);
  if (fields.count("state")) filter.states = StatesIn(fields["state"]);
  if (fields.count("user")) filter.user = fields["user"];
  return filter;
}

// The URL of the page after one that ended at job `last_id`.
std::string NextPageUrl(const JobFilter& filter, int64_t last_id) {
  std::string url = "/api/jobs?limit=" + std::to_string(filter.limit) + "&before=" + std::to_string(last_id);
  std::string states;
  for (JobState state : filter.states) states += (states.empty() ? "" : ",") + std::string(ToString(state));
  if (!states.empty()) url += "&state=" + states;
  static const char* kHex = "0123456789ABCDEF";
  if (!filter.user.empty()) url += "&user=";
  for (unsigned char c : filter.user) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.')
      url += char(c);
    else
      url += std::string("%") + kHex[c >> 4] + kHex[c & 15];
  }
  return url;
}

double NumberOr(const json& object, const char* key, double fallback) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_number()) return fallback;
  return object[key].get<double>();
}

}  // namespace

WebReply JobViews::Answer(const std::string& target) const {
  const std::string path = target.substr(0, target.find('?'));
  try {
    if (path == "/api/jobs") return ApiJobs(target);
    if (path == "/api/workers") return ApiWorkers();
    if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", MetricsText()};
    const std::string jobs_prefix = "/api/jobs/";
    if (path.rfind(jobs_prefix, 0) == 0) {
      const std::string rest = path.substr(jobs_prefix.size());
      const size_t slash = rest.find('/');
      const auto id = ParseJobId(rest.substr(0, slash));
      if (!id) return NotFound("no job " + rest.substr(0, slash));
      if (slash == std::string::npos) return ApiJob(*id);
      if (rest.substr(slash) == "/heatmap.svg") return HeatmapSvg(*id);
    }
    return NotFound("no such API path: " + path + " (see GET /api)");
  } catch (const BadQuery& e) {
    return JsonReply(400, {{"error", e.what()}});
  } catch (const std::exception& e) {  // a store error: the loop goes on
    spdlog::error("dashboard query {}: {}", path, e.what());
    return JsonReply(500, {{"error", e.what()}});
  }
}

// Note [Paged job listing].
WebReply JobViews::ApiJobs(const std::string& target) const {
  const JobFilter filter = JobPageFilter(target);
  JobFilter one_more = filter;  // a row past the page says whether there is a next one
  ++one_more.limit;
  std::vector<JobRecord> page = sources_.store.JobsMatching(one_more);
  const bool more = int64_t(page.size()) > filter.limit;
  if (more) page.pop_back();
  json jobs = json::array();
  for (const JobRecord& j : page) {
    json job = JobJson(j);
    job["slurm"] = SlurmText(j.id);
    job["waiting"] = WaitingText(j);
    const json latest = LatestEpoch(sources_.store.NewestEpochRow(j.id));
    job["epochs"] = latest.is_null() ? 0 : NumberOr(latest, "epoch", 0);
    job["ms_per_step"] = latest.is_null() ? json(nullptr) : json(NumberOr(latest, "ms_per_step", 0));
    jobs.push_back(job);
  }
  return JsonReply(200, {{"jobs", jobs},
                         {"now", Now()},
                         {"total", sources_.store.CountMatching(filter)},
                         {"limit", filter.limit},
                         {"next", more ? json(NextPageUrl(filter, page.back().id)) : json(nullptr)}});
}

WebReply JobViews::ApiJob(int64_t id) const {
  const auto record = sources_.store.Find(id);
  if (!record) return NotFound("no job " + std::to_string(id));
  json job = JobJson(*record);
  job["slurm"] = SlurmText(id);
  job["waiting"] = WaitingText(*record);
  json attempts = json::array(), events = json::array(), epochs = json::array(), breakdowns = json::array();
  for (const AttemptRecord& a : sources_.store.Attempts(id))
    attempts.push_back({{"attempt", a.attempt},
                        {"placement", a.placement},
                        {"outcome", DescribeEnd(a.end, a.end_reason)},
                        {"started_at", a.started_at},
                        {"ended_at", a.ended_at > 0 ? json(a.ended_at) : json(nullptr)},
                        {"rank_seconds", a.RankSeconds(Now())},
                        {"gpu_seconds", a.GpuSeconds(Now())}});
  for (const EventRecord& e : sources_.store.TimedEvents(id)) events.push_back({{"at", e.at}, {"text", e.text}});
  for (const EpochRecord& row : sources_.store.EpochRows(id)) {
    epochs.push_back(EpochJson(SplitCsv(row.csv_header), row));
    json breakdown = ParseBoundedJsonOrDiscarded(row.breakdown_json);
    if (breakdown.is_object()) {
      breakdown["epoch"] = row.epoch;
      breakdown["attempt"] = row.attempt;
      breakdowns.push_back(breakdown);
    }
  }
  job["attempt_list"] = attempts;
  job["events"] = events;
  job["epochs"] = epochs;
  job["breakdown"] = breakdowns;
  job["step_parts"] = {"wait", "h2d", "forward", "backward", "comm", "optimizer"};
  // Note [Job output]: the tail of the latest attempt's output.log.
  job["output"] = {
      {"attempt", record->attempts},
      {"tail", record->attempts > 0 ? sources_.outputs.Tail(id, record->attempts, kDashboardOutputBytes) : ""}};
  const bool heatmap = HeatmapFile(id, record->name).ok();
  job["heatmap"] = heatmap ? json("/api/jobs/" + std::to_string(id) + "/heatmap.svg") : json(nullptr);
  if (record->is_search) {
    wire::SearchReport search;
    FillSearchReport(id, &search);
    job["search"] = SearchJson(search);
  }
  return JsonReply(200, job);
}

FileRead JobViews::HeatmapFile(int64_t id, const std::string& job_name) const {
  return ReadFileBeneath(settings_.runs_dir, std::to_string(id) + "/" + job_name + "/latency_heatmap.svg",
                         kMaxHeatmapBytes);
}

// A benchmark job's latency heatmap, as its worker drew it (worker/report/bench_report.h).
WebReply JobViews::HeatmapSvg(int64_t id) const {
  const auto record = sources_.store.Find(id);
  if (!record) return NotFound("no job " + std::to_string(id));
  FileRead svg = HeatmapFile(id, record->name);
  if (svg.status == FileRead::kMissing)
    return NotFound("job " + std::to_string(id) + " has no heatmap (only benchmark jobs draw one)");
  if (!svg.ok()) return NotFound("job " + std::to_string(id) + ": its heatmap is not served: " + svg.why);
  return {200, "image/svg+xml", std::move(svg.bytes)};
}

WebReply JobViews::ApiWorkers() const {
  json workers = json::array();
  const double lost_after = sources_.ranks.silence_s();
  for (const auto& [key, entry] : sources_.ranks.entries()) {
    const double silent = sources_.ranks.SilentFor(entry);
    workers.push_back({{"world", entry.info.world()},
                       {"rank", entry.info.rank()},
                       {"world_size", entry.info.world_size()},
                       {"host", entry.info.host()},
                       {"slot", entry.info.slot()},
                       {"device", entry.info.device()},
                       {"pid", entry.info.pid()},
                       {"seconds_since_heartbeat", silent},
                       {"alive", silent <= lost_after},
                       {"job", entry.job ? json(entry.job) : json(nullptr)},
                       {"attempt", entry.attempt},
                       {"last_log_line", entry.last_log_line}});
  }
  json warnings = json::array();
  for (const Warning& w : sources_.ranks.warnings()) warnings.push_back({{"at", w.at}, {"text", w.text}});
  return JsonReply(200, {{"workers", workers},
                         {"warnings", warnings},
                         {"squat_attempts", sources_.ranks.squat_attempts()},
                         {"heartbeat_s", settings_.heartbeat_s},
                         {"lost_after_s", lost_after}});
}

namespace {

void DeclareCoordinatorMetrics(Metrics* m) {
  m->DeclareGauge("trainyard_jobs", "Jobs by state.");
  m->DeclareGauge("trainyard_queue_depth", "Jobs waiting to run (QUEUED).");
  m->DeclareHistogram("trainyard_submit_to_running_seconds",
                      "From a job's submission to the start of its first attempt.", SubmitToRunningBounds());
  m->DeclareCounter("trainyard_attempts_total", "Ended attempts by outcome.");
  m->DeclareGauge("trainyard_running_attempts", "Attempts running now.");
  m->DeclareGauge("trainyard_worker_up", "1 for a registered rank heard within its liveness window, else 0.");
  m->DeclareGauge("trainyard_worker_heartbeat_age_seconds", "Listening time since a rank's last message.");
  m->DeclareGauge("trainyard_job_ms_per_step", "A running job's mean ms per step in its latest epoch.");
  m->DeclareGauge("trainyard_job_data_wait_ms", "A running job's mean data wait per step in its latest epoch.");
  m->DeclareGauge("trainyard_slurm_job",
                  "Under --slurm: 1 per running attempt, labelled with its Slurm job id, state and reason.");
  m->DeclareCounter("trainyard_rank_seconds_total",
                    "Rank-seconds used by every attempt that ran, per user (running ones until now).");
  m->DeclareCounter("trainyard_gpu_seconds_total",
                    "GPU-seconds used by every attempt that ran, per user (running ones until now).");
  m->DeclareGauge("trainyard_user_jobs", "Jobs by owner and state.");
  m->DeclareCounter("trainyard_preemptions_total",
                    "Running jobs asked to stop for a job of higher priority since start.");
  m->DeclareCounter("trainyard_squat_attempts_total",
                    "Registrations refused since start for claiming another agent's world id with another token.");
}

}  // namespace

// Everything is derived from the store and the registry at scrape time, so the counters
// and the histogram survive a coordinator restart unchanged: they only ever grow with
// the durable history.
std::string JobViews::MetricsText() const {
  Metrics m;
  DeclareCoordinatorMetrics(&m);
  AddJobMetrics(&m);
  AddAttemptMetrics(&m);
  AddWorkerMetrics(&m);
  return m.Render() + sources_.loop_metrics.Render();
}

// Jobs by state and owner, submit-to-running latency, and running jobs' step times.
void JobViews::AddJobMetrics(Metrics* m) const {
  std::map<std::string, int64_t> by_state;
  for (const char* state : {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "STOPPED"}) by_state[state] = 0;
  for (const auto& [state_user, count] : sources_.store.JobCountsByStateAndUser()) {
    by_state[state_user.first] += count;
    m->Set("trainyard_user_jobs", {{"user", state_user.second}, {"state", state_user.first}}, double(count));
  }
  for (const auto& [state, count] : by_state) m->Set("trainyard_jobs", {{"state", state}}, double(count));
  m->Set("trainyard_queue_depth", {}, double(by_state["QUEUED"]));
  for (double seconds : sources_.store.SecondsToFirstStart())
    m->Observe("trainyard_submit_to_running_seconds", {}, seconds);
  const FoldedHistogram forgotten = sources_.store.PrunedFirstStarts();  // Note [History retention]
  m->ObserveFolded("trainyard_submit_to_running_seconds", {}, forgotten.by_upper_bound, forgotten.sum, forgotten.count);
  for (const JobRecord& j : sources_.store.JobsIn(JobState::kRunning)) {
    const json latest = LatestEpoch(sources_.store.NewestEpochRow(j.id));
    if (latest.is_null()) continue;
    const MetricLabels labels = {{"job", std::to_string(j.id)}, {"name", j.name}, {"user", j.user}};
    m->Set("trainyard_job_ms_per_step", labels, NumberOr(latest, "ms_per_step", 0));
    m->Set("trainyard_job_data_wait_ms", labels, NumberOr(latest, "wait_ms", 0));
  }
}

// Ended attempts, running ones (with their Slurm jobs), usage, preemptions and squats.
void JobViews::AddAttemptMetrics(Metrics* m) const {
  m->Add("trainyard_preemptions_total", {}, double(sources_.preemptions));
  for (const auto& [outcome, count] : sources_.store.AttemptOutcomes())
    m->Add("trainyard_attempts_total", {{"outcome", OutcomeName(outcome)}}, double(count));
  m->Set("trainyard_running_attempts", {}, double(sources_.running.size()));
  m->Add("trainyard_squat_attempts_total", {}, double(sources_.ranks.squat_attempts()));
  for (const Usage& u : sources_.store.UsageBy(/*per_user=*/true, Now())) {
    m->Add("trainyard_rank_seconds_total", {{"user", u.user}}, u.rank_seconds);
    m->Add("trainyard_gpu_seconds_total", {{"user", u.user}}, u.gpu_seconds);
  }
  for (const auto& [id, attempt] : sources_.running)
    if (!attempt.slurm_job.empty())
      m->Set("trainyard_slurm_job",
             {{"job", std::to_string(id)},
              {"slurm_job", attempt.slurm_job},
              {"state", attempt.slurm_state.state.empty() ? "SUBMITTED" : attempt.slurm_state.state},
              {"reason", attempt.slurm_state.reason}},
             1);
}

// Each registered rank's liveness.
void JobViews::AddWorkerMetrics(Metrics* m) const {
  for (const auto& [key, entry] : sources_.ranks.entries()) {
    const MetricLabels labels = {
        {"world", key.first}, {"rank", std::to_string(key.second)}, {"host", entry.info.host()}};
    const double silent = sources_.ranks.SilentFor(entry);
    m->Set("trainyard_worker_up", labels, sources_.ranks.Alive(entry) ? 1 : 0);
    m->Set("trainyard_worker_heartbeat_age_seconds", labels, silent);
  }
}

}  // namespace trainyard
