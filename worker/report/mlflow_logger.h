// MLflow tracking for finetune jobs (log.mlflow), over the tracking server's REST API
// (version 2.0), with libcurl:
//   GET  /api/2.0/mlflow/experiments/get-by-name?experiment_name=N -> experiment.experiment_id;
//        RESOURCE_DOES_NOT_EXIST -> POST /api/2.0/mlflow/experiments/create {name}
//   POST /api/2.0/mlflow/runs/create {experiment_id, run_name, start_time, tags}
//        -> run.info.{run_id, artifact_uri}
//   POST /api/2.0/mlflow/runs/log-batch {run_id, metrics, params}: at most 1000 metrics
//        and 100 params a request
//   PUT  /api/2.0/mlflow-artifacts/artifacts/<artifact_uri's path>/<file>: the server's
//        proxied artifact store, which is where an artifact_uri "mlflow-artifacts:/..." lives
//   POST /api/2.0/mlflow/runs/update {run_id, status, end_time}
// The run's id is kept in <run dir>/mlflow_run.json, so a resumed job goes on logging
// into the same MLflow run.
//
// Tracking must never fail or slow training. Callers only append to bounded queues; one
// background thread does all the talking. While the server cannot be reached it retries
// with backoff (1 s doubling to 30 s); beyond kMaxQueuedMetrics waiting points the oldest
// are dropped and counted, with one warning. A request the server refuses (a 4xx other
// than 429) is dropped with a warning, since sending it again cannot help. Close() waits
// up to kFlushTimeout for what is still queued, then says what was not sent.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worker/report/run_log.h"

namespace trainyard {

struct MlflowOptions {
  std::string uri;  // http(s)://host[:port][/prefix], no trailing slash
  std::string experiment, run_name;
  std::string run_dir;                        // where mlflow_run.json is kept
  std::map<std::string, std::string> params;  // logged once, first
};

// Whether this build can talk to MLflow (it needs libcurl), and the sink when it can
// (std::runtime_error when it cannot).
bool MlflowAvailable();
std::unique_ptr<MetricSink> OpenMlflow(const MlflowOptions& options);

class MlflowLogger : public MetricSink {
 public:
  static constexpr size_t kMaxQueuedMetrics = 100'000;
  static constexpr std::chrono::seconds kFlushTimeout{10};

  struct Counts {
    int64_t sent_metrics = 0, dropped_metrics = 0, uploaded_files = 0, refused_requests = 0;
  };

  // Starts the background thread; never blocks on the network.
  explicit MlflowLogger(MlflowOptions options);
  // Close("FAILED") if Close was not called.
  ~MlflowLogger() override;
  MlflowLogger(const MlflowLogger&) = delete;
  MlflowLogger& operator=(const MlflowLogger&) = delete;

  // Metric points at one training step, stamped with the wall clock now. Non-finite
  // values are skipped (JSON cannot hold them).
  void LogMetrics(int64_t step, const std::vector<std::pair<std::string, double>>& values) override;
  // Uploads every file under `folder` as artifacts under `artifact_path` of the run.
  void LogArtifacts(const std::string& folder, const std::string& artifact_path) override;
  // Marks the run FINISHED, FAILED or KILLED once the queues are sent, waiting at most
  // kFlushTimeout; later calls do nothing.
  void Close(const std::string& status) override;
  Counts counts() const;

 private:
  struct Metric {
    std::string key;
    double value;
    int64_t timestamp_ms, step;
  };
  struct Artifact {
    std::string file, artifact_path;  // artifact_path: relative, with '/' separators
  };
  class Http;

  void Run();
  // One unit of work: true if the server answered (or refused) it, false to retry later.
  bool EnsureRun(Http& http);
  bool SendParams(Http& http);
  bool SendMetrics(Http& http);
  bool SendArtifact(Http& http);
  bool FinishRun(Http& http, const std::string& status);
  void NoteRefused(const std::string& what, const std::string& answer);
  void LoadSavedRun();
  void SaveRun() const;
  // Logs a warning the first time `key` goes wrong, and again after it has worked since.
  void WarnOnce(const std::string& key, const std::string& message);

  MlflowOptions options_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Metric> metrics_;
  std::deque<Artifact> artifacts_;
  std::vector<std::pair<std::string, std::string>> params_;
  std::string close_status_;  // set by Close: the thread finishes the run, then ends
  std::chrono::steady_clock::time_point close_deadline_;
  std::atomic<int64_t> abort_after_ns_{INT64_MAX};  // close_deadline_, for requests in flight
  bool closed_ = false;
  Counts counts_;
  std::map<std::string, bool> warned_;
  // The run, once known (thread only, apart from the saved file).
  std::string experiment_id_, run_id_, artifact_uri_;
};

}  // namespace trainyard
