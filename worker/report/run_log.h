// What a training run tells its user: the console epoch table, a progress line while
// an epoch runs, runs/<job>/{epochs.csv, steps.jsonl, evals.jsonl, summary.json}, and
// the same figures as TensorBoard scalars in runs/<job>/tb/.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace trainyard {

// One part of a step across ranks: each rank's mean ms per step, reduced.
struct PartStats {
  double min = 0, median = 0, max = 0;
};

// The parts a step is split into, in table order.
inline constexpr const char* kStepParts[] = {"wait", "h2d", "forward", "backward", "comm", "optimizer"};
inline constexpr int kNumStepParts = 6;

struct EpochRow {
  int64_t epoch = 0;  // 1-based
  double time_s = 0;
  int64_t steps = 0, skipped_steps = 0;
  double ms_per_step = 0, samples_per_s = 0, data_wait_pct = 0;
  double train_loss = 0, eval_loss = 0, eval_acc = 0, lr = 0;
  std::optional<double> loss_scale;  // fp16 only
  // Mean ms per step of each part of a step, on rank 0.
  double wait_ms = 0, h2d_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
  // Across ranks (a single rank gives min = median = max).
  int ranks = 1;
  int64_t global_batch = 0;
  double comm_ms = 0;              // exposed communication on rank 0
  PartStats parts[kNumStepParts];  // indexed like kStepParts
  int slowest_rank = 0;
  double slowest_ms_per_step = 0;
  std::string slowest_host;  // the host the slowest rank ran on
  // Each rank's mean ms per step of each part, by job rank (not in epochs.csv: the
  // coordinator's dashboard draws it).
  std::vector<std::array<double, kNumStepParts>> rank_parts;
  // An elastic run's quorum sizes over the epoch and how often they changed
  // (TrainProgress::Membership); 0 elsewhere, and empty cells in epochs.csv.
  int replicas_min = 0, replicas_max = 0, replica_changes = 0;
};

// epochs.csv's header, and one row of it.
std::string EpochCsvHeader();
std::string EpochCsvLine(const EpochRow& row);

class EventFileWriter;
class RunCurves;

// Where a run's figures go besides its own files: MLflow (mlflow_logger.h). Calls must
// return at once; a sink that talks to a server does so on a thread of its own.
class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual void LogMetrics(int64_t step, const std::vector<std::pair<std::string, double>>& values) = 0;
  virtual void LogArtifacts(const std::string& folder, const std::string& artifact_path) = 0;
  // "FINISHED" or "FAILED"; flushes what is queued (bounded in time).
  virtual void Close(const std::string& status) = 0;
};

// TensorBoard scalars (runs/<job>/tb/, one event file per process): each steps.jsonl
// line's numbers as "train/<key>" at its step, each evals.jsonl line's metrics
// "<split>_<name>" as "<split>/<name>" (HF Trainer's names) at its step, and each
// epochs.csv row's numbers as "epoch/<column>" at the global step that ended the epoch,
// so a file's steps never decrease. The values are exactly the files' (as float32). A
// TensorBoard file that cannot be written costs a warning, never the run.
class RunLog {
 public:
  // Opens runs/<job>/. With `resume_epoch` > 0 (the 1-based epoch being resumed), the
  // rows of that epoch and later, and the step and evaluation lines after `resume_step`,
  // are dropped from the existing files, so every epoch, step and evaluation appears
  // exactly once.
  RunLog(std::string run_dir, int64_t resume_epoch, int64_t resume_step);
  // The epochs of a finished run in runs/<job>/, read and nothing written or opened: to
  // show its table and hand its rows on. Nothing may be added to it.
  static RunLog ReadFinished(std::string run_dir);
  ~RunLog();
  RunLog(RunLog&&) noexcept;

  void PrintHeader() const;
  void PrintRow(const EpochRow& row) const;
  // Console row plus an atomic rewrite of epochs.csv.
  void AddEpoch(const EpochRow& row);
  void AddStep(const nlohmann::json& line);
  // One evaluation: a line of evals.jsonl ({"step", "epoch", "split", then metrics named
  // "<split>_<name>"}), its metrics to TensorBoard and the sink.
  void AddEvaluation(const nlohmann::json& line);
  void WriteSummary(const nlohmann::json& summary) const;
  // Also hands every step line and epoch row to `sink`, as "train/<key>" and
  // "epoch/<column>" (the TensorBoard names). The sink is closed FINISHED when the log
  // goes, or FAILED if it goes while an exception unwinds.
  void AttachSink(std::unique_ptr<MetricSink> sink);
  // Sends a folder (the trained model) to the sink as artifacts; nothing without one.
  void AddArtifacts(const std::string& folder, const std::string& artifact_path);
  const std::vector<EpochRow>& rows() const { return rows_; }
  // rows() as written in epochs.csv (kept verbatim across resumes).
  const std::vector<std::string>& csv_lines() const { return csv_lines_; }
  const std::string& dir() const { return dir_; }

 private:
  explicit RunLog(std::string run_dir);  // opens nothing
  void LoadRows(int64_t before_epoch);
  // Keeps the lines of a JSON-lines file whose "step" is at most `up_to_step`, and
  // returns them parsed.
  std::vector<nlohmann::json> TrimLines(const std::string& file, int64_t up_to_step);
  void WriteCsv() const;
  // Rewrites curves.svg (run_curves.h); a failure costs a warning.
  void WriteCurves() const;
  // Hands scalars to the event file, or drops TensorBoard output after a failure.
  void AddTensorBoardScalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);

  std::string dir_;
  std::unique_ptr<EventFileWriter> tensorboard_;
  std::unique_ptr<MetricSink> sink_;
  std::unique_ptr<RunCurves> curves_;
  std::vector<EpochRow> rows_;
  std::vector<std::string> csv_lines_;  // rows_ as written, kept verbatim across resumes
  std::ofstream steps_, evals_;
};

// A one-line progress indicator on stderr, "LABEL DONE/TOTAL (PCT%) [ELAPSED<LEFT]
// DETAIL": redrawn in place on a terminal, printed every 10% otherwise. ELAPSED is
// since construction and LEFT the estimate at the rate since then (tqdm's), as m:ss or
// h:mm:ss; `first` is what was done before (a resumed epoch's steps), which the rate
// leaves out.
class ProgressLine {
 public:
  ProgressLine(std::string label, int64_t total, bool enabled, int64_t first = 0);
  void Update(int64_t done, const std::string& detail);
  void Finish();

  // "m:ss", or "h:mm:ss" from an hour.
  static std::string FormatClock(double seconds);
  // "ELAPSED<LEFT" after `elapsed_s` seconds with `done` of `total` done, LEFT at the rate
  // of the work since `first` ("?" before any): what the line shows between brackets, for
  // jobs that report each piece of work on a line of its own (benchmark cells, generation
  // batches).
  static std::string Clock(double elapsed_s, int64_t done, int64_t total, int64_t first = 0);

 private:
  std::string label_;
  int64_t total_, first_;
  bool enabled_, tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_draw_{};
};

}  // namespace trainyard
