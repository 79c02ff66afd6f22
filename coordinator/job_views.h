// What the coordinator shows, and nothing it changes: jobctl's read requests (list,
// status, report, logs, workers, usage), the dashboard's JSON API and /metrics. Each
// answer is built at the moment it is asked from the store, the rank registry, the
// running attempts and the last scheduling pass's reasons, which the views hold by
// const reference: they cannot write, so what jobctl, the dashboard and a scrape see is
// the loop's own state and never a copy of it. They run on the loop thread (Note
// [Dashboard queries] in coordinator/server.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/regular_file.h"
#include "coordinator/job_output.h"
#include "coordinator/rank_registry.h"
#include "coordinator/running_attempt.h"
#include "coordinator/state_store.h"
#include "trainyard.pb.h"

namespace trainyard {

class Metrics;  // common/metrics.h

// One answer to a dashboard query.
struct WebReply {
  int status = 200;
  std::string content_type;
  std::string body;
};

inline constexpr size_t kMaxSummaryBytes = size_t(4) << 20;
inline constexpr size_t kMaxHeatmapBytes = size_t(8) << 20;
// The buckets of trainyard_submit_to_running_seconds, in which forgotten jobs' figures
// are kept too (Note [History retention] in coordinator/state_store.h).
inline const std::vector<double>& SubmitToRunningBounds() {
  static const std::vector<double> bounds = {0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 14400};
  return bounds;
}

// A job state on the wire.
wire::JobState ToWire(JobState state);

// Note [A job's metric]
// `jobctl list` and `status` show each job's metric as its newest epoch row gave it (the
// rows the coordinator keeps, so it holds across hosts). The first of these with a value
// there: the metric the job names (checkpoint.best_metric) or its search judges it by (a
// trial), the rows' evaluation metrics besides the loss (eval_acc), eval_loss, and
// train_loss. A search shows its best trial's. A job with no row yet shows none.

class JobViews {
 public:
  // What the views read; each outlives them, and only the loop thread changes it.
  struct Sources {
    const StateStore& store;
    const RankRegistry& ranks;
    const std::map<int64_t, RunningAttempt>& running;             // by job id
    const std::unordered_map<std::string, std::string>& waiting;  // the last pass's reasons, by decimal id
    const OutputFiles& outputs;                                   // Note [Job output]
    const Metrics& loop_metrics;                                  // rendered after the store's on /metrics
    const int64_t& preemptions;                                   // since the coordinator started
  };
  struct Settings {
    std::string runs_dir;              // absolute
    double fairshare_half_life_s = 0;  // Note [Fair share]; 0: no decay
    bool slurm = false;                // --slurm: no pool, and no pass fills `waiting`
    int64_t list_page = 500;           // jobs in one listing reply at most
    double heartbeat_s = 1;            // the period workers heartbeat at, shown on /api/workers
    std::function<double()> now;       // seconds since the epoch, the Server's clock
  };
  JobViews(Sources sources, Settings settings);

  // jobctl's replies (protocol in proto/trainyard.proto); an ErrorReply for bad input.
  wire::Envelope List(const wire::ListRequest& request) const;
  wire::Envelope Status(int64_t id) const;
  wire::Envelope Report(int64_t id) const;
  wire::Envelope Logs(const wire::LogsRequest& request) const;
  wire::Envelope Workers() const;
  wire::Envelope UsageReport(bool per_user) const;
  // Why a queued job waits ("<Code>: <detail>"); "" for a job not queued.
  std::string WaitingText(const JobRecord& job) const;
  // A search's trials, their curves and its best trial (Note [ASHA] in coordinator/search.h).
  void FillSearchReport(int64_t search, wire::SearchReport* out) const;
  // "job <id>: <state> (<reason>)" for a running Slurm attempt of job `id`; "" otherwise.
  std::string SlurmText(int64_t id) const;

  // One GET of the dashboard's API (/api/jobs, /api/jobs/<id>, /api/jobs/<id>/heatmap.svg,
  // /api/workers) or /metrics (job_views_web.cc). Unknown paths and jobs get 404, a bad
  // query 400.
  WebReply Answer(const std::string& target) const;
  std::string MetricsText() const;

 private:
  double Now() const { return settings_.now(); }
  // Note [A job's metric]. `search_metrics` caches each search's metric across one listing.
  void FillMetric(const JobRecord& job, std::map<int64_t, std::string>* search_metrics, wire::JobInfo* info) const;
  wire::Envelope OutputLogs(const JobRecord& job, const wire::LogsRequest& request) const;
  WebReply ApiJobs(const std::string& target) const;
  WebReply ApiJob(int64_t id) const;
  WebReply HeatmapSvg(int64_t id) const;
  // The job's latency_heatmap.svg, a regular file beneath the runs folder (never a
  // FIFO, device or symlink: Note [Files a job wrote] in coordinator/server.h).
  FileRead HeatmapFile(int64_t id, const std::string& job_name) const;
  WebReply ApiWorkers() const;
  void AddJobMetrics(Metrics* m) const;
  void AddAttemptMetrics(Metrics* m) const;
  void AddWorkerMetrics(Metrics* m) const;

  Sources sources_;
  Settings settings_;
};

}  // namespace trainyard
