#include "worker/report/run_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <sstream>

#include "common/atomic_file.h"
#include "common/csv.h"
#include "common/epoch_table.h"
#include "worker/report/event_file.h"
#include "worker/report/run_curves.h"

namespace trainyard {

std::string EpochCsvHeader() {
  std::string header =
      "epoch,time_s,steps,ms_per_step,samples_per_s,data_wait_pct,train_loss,eval_loss,eval_acc,lr,"
      "loss_scale,skipped_steps,wait_ms,h2d_ms,forward_ms,backward_ms,optimizer_ms,ranks,global_batch,"
      "comm_ms";
  for (const char* part : kStepParts)
    header += std::string(",") + part + "_ms_min," + part + "_ms_med," + part + "_ms_max";
  return header + ",slowest_rank,slowest_ms_per_step,slowest_host,replicas_min,replicas_max,replica_changes";
}

std::string EpochCsvLine(const EpochRow& r) {
  std::string line = fmt::format(
      "{},{:.3f},{},{:.3f},{:.2f},{:.2f},{:.6f},{:.6f},{:.6f},{:.6e},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{},{},{:."
      "3f}",
      r.epoch, r.time_s, r.steps, r.ms_per_step, r.samples_per_s, r.data_wait_pct, r.train_loss, r.eval_loss,
      r.eval_acc, r.lr, r.loss_scale ? fmt::format("{:g}", *r.loss_scale) : "", r.skipped_steps, r.wait_ms, r.h2d_ms,
      r.forward_ms, r.backward_ms, r.optimizer_ms, r.ranks, r.global_batch, r.comm_ms);
  for (const PartStats& p : r.parts) line += fmt::format(",{:.3f},{:.3f},{:.3f}", p.min, p.median, p.max);
  // A hostname holds no comma or quote (RFC 1123), so it needs no CSV quoting.
  line += fmt::format(",{},{:.3f},{}", r.slowest_rank, r.slowest_ms_per_step, r.slowest_host);
  if (r.replicas_max == 0) return line + ",,,";
  return line + fmt::format(",{},{},{}", r.replicas_min, r.replicas_max, r.replica_changes);
}

namespace {

// The fields the console table and curves.svg show, read by column name so older files
// still load.
EpochRow ParseCsvLine(const std::vector<std::string>& header, const std::string& line) {
  std::vector<std::string> cells = SplitCsv(line);
  cells.resize(header.size());
  auto get = [&](const char* name) {
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == name && !cells[i].empty()) return std::stod(cells[i]);
    return 0.0;
  };
  EpochRow r;
  r.epoch = static_cast<int64_t>(get("epoch"));
  r.time_s = get("time_s");
  r.steps = static_cast<int64_t>(get("steps"));
  r.ms_per_step = get("ms_per_step");
  r.samples_per_s = get("samples_per_s");
  r.data_wait_pct = get("data_wait_pct");
  r.train_loss = get("train_loss");
  r.eval_loss = get("eval_loss");
  r.eval_acc = get("eval_acc");
  r.lr = get("lr");
  if (get("loss_scale") > 0) r.loss_scale = get("loss_scale");
  r.comm_ms = get("comm_ms");
  r.slowest_rank = static_cast<int>(get("slowest_rank"));
  r.slowest_ms_per_step = get("slowest_ms_per_step");
  r.ranks = std::max(1, static_cast<int>(get("ranks")));
  r.replicas_min = static_cast<int>(get("replicas_min"));
  r.replicas_max = static_cast<int>(get("replicas_max"));
  r.replica_changes = static_cast<int>(get("replica_changes"));
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == "slowest_host") r.slowest_host = cells[i];
  for (int part = 0; part < kNumStepParts; ++part) {
    const std::string name = kStepParts[part];
    r.parts[part] = {get((name + "_ms_min").c_str()), get((name + "_ms_med").c_str()), get((name + "_ms_max").c_str())};
  }
  return r;
}

// The TensorBoard event files in `folder` (events.out.tfevents.*), and nothing else.
void RemoveEventFiles(const std::string& folder) {
  std::error_code error;
  if (!std::filesystem::is_directory(std::filesystem::symlink_status(folder, error))) return;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0 && !entry.is_directory(error))
      std::filesystem::remove(entry.path(), error);
}

}  // namespace

RunLog::RunLog(std::string run_dir, int64_t resume_epoch, int64_t resume_step)
    : dir_(std::move(run_dir)), curves_(std::make_unique<RunCurves>()) {
  std::filesystem::create_directories(dir_);
  if (resume_epoch > 0) {
    LoadRows(resume_epoch);
    for (const nlohmann::json& line : TrimLines("steps.jsonl", resume_step)) curves_->AddStep(line);
    for (const nlohmann::json& line : TrimLines("evals.jsonl", resume_step)) curves_->AddEvaluation(line);
  } else {
    std::filesystem::remove(dir_ + "/steps.jsonl");
    std::filesystem::remove(dir_ + "/evals.jsonl");
    RemoveEventFiles(dir_ + "/tb");  // a fresh run's curves start empty
  }
  WriteCsv();
  steps_.open(dir_ + "/steps.jsonl", std::ios::app);
  evals_.open(dir_ + "/evals.jsonl", std::ios::app);
  try {
    tensorboard_ = std::make_unique<EventFileWriter>(dir_ + "/tb");
  } catch (const std::exception& e) {
    spdlog::warn("no TensorBoard scalars for this run: {}", e.what());
  }
}

RunLog::RunLog(std::string run_dir) : dir_(std::move(run_dir)), curves_(std::make_unique<RunCurves>()) {}

RunLog RunLog::ReadFinished(std::string run_dir) {
  RunLog log(std::move(run_dir));
  log.LoadRows(std::numeric_limits<int64_t>::max());
  return log;
}

RunLog::~RunLog() {
  if (sink_) sink_->Close(std::uncaught_exceptions() > 0 ? "FAILED" : "FINISHED");
}

void RunLog::AttachSink(std::unique_ptr<MetricSink> sink) { sink_ = std::move(sink); }

void RunLog::AddArtifacts(const std::string& folder, const std::string& artifact_path) {
  if (sink_) sink_->LogArtifacts(folder, artifact_path);
}
RunLog::RunLog(RunLog&&) noexcept = default;

void RunLog::AddTensorBoardScalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  if (!tensorboard_ || scalars.empty()) return;
  try {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    tensorboard_->AddScalars(step, now, scalars);
    tensorboard_->Flush();
  } catch (const std::exception& e) {
    spdlog::warn("TensorBoard scalars stop here: {}", e.what());
    tensorboard_.reset();
  }
}

void RunLog::LoadRows(int64_t before_epoch) {
  std::ifstream in(dir_ + "/epochs.csv");
  std::string line;
  if (!std::getline(in, line)) return;
  const std::vector<std::string> header = SplitCsv(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    EpochRow row = ParseCsvLine(header, line);
    if (row.epoch >= before_epoch) continue;
    rows_.push_back(row);
    csv_lines_.push_back(line);
  }
}

std::vector<nlohmann::json> RunLog::TrimLines(const std::string& file, int64_t up_to_step) {
  const std::string path = dir_ + "/" + file;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return {};
  std::ifstream in(path);
  std::string kept, line;
  std::vector<nlohmann::json> kept_lines;
  while (std::getline(in, line)) {
    auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object() || parsed.value("step", int64_t(0)) > up_to_step) continue;
    kept += line + "\n";
    kept_lines.push_back(std::move(parsed));
  }
  WriteFileAtomically(path, kept);
  return kept_lines;
}

void RunLog::WriteCsv() const {
  std::string text = EpochCsvHeader() + "\n";
  for (const auto& line : csv_lines_) text += line + "\n";
  WriteFileAtomically(dir_ + "/epochs.csv", text);
}

void RunLog::PrintHeader() const { spdlog::info("{}", EpochTableHeader()); }

void RunLog::AddEpoch(const EpochRow& r) {
  rows_.push_back(r);
  csv_lines_.push_back(EpochCsvLine(r));
  WriteCsv();
  PrintRow(r);
  WriteCurves();
  int64_t end_step = 0;
  for (const EpochRow& row : rows_) end_step += row.steps;
  const std::vector<std::string> header = SplitCsv(EpochCsvHeader()), cells = SplitCsv(csv_lines_.back());
  std::vector<std::pair<std::string, float>> scalars;
  std::vector<std::pair<std::string, double>> values;
  for (size_t i = 0; i < header.size() && i < cells.size(); ++i) {
    char* end = nullptr;
    const double value = std::strtod(cells[i].c_str(), &end);
    if (header[i] == "epoch" || header[i] == "slowest_host" || cells[i].empty() || *end != '\0') continue;
    values.emplace_back("epoch/" + header[i], value);
    scalars.emplace_back(values.back().first, static_cast<float>(value));
  }
  AddTensorBoardScalars(end_step, scalars);
  if (sink_) sink_->LogMetrics(end_step, values);
}

void RunLog::PrintRow(const EpochRow& r) const {
  static const std::vector<std::string> header = SplitCsv(EpochCsvHeader());
  spdlog::info("{}", EpochTableRow(header, SplitCsv(EpochCsvLine(r))));
}

void RunLog::WriteCurves() const {
  try {
    WriteFileAtomically(dir_ + "/curves.svg", curves_->Render(rows_));
  } catch (const std::exception& e) {
    spdlog::warn("curves.svg not updated: {}", e.what());
  }
}

void RunLog::AddStep(const nlohmann::json& line) {
  steps_ << line.dump() << "\n";
  steps_.flush();
  curves_->AddStep(line);
  std::vector<std::pair<std::string, float>> scalars;
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [key, value] : line.items())
    if (value.is_number() && key != "step" && key != "epoch") {
      values.emplace_back("train/" + key, value.get<double>());
      scalars.emplace_back(values.back().first, static_cast<float>(values.back().second));
    }
  AddTensorBoardScalars(line.value("step", int64_t(0)), scalars);
  if (sink_) sink_->LogMetrics(line.value("step", int64_t(0)), values);
}

void RunLog::AddEvaluation(const nlohmann::json& line) {
  evals_ << line.dump() << "\n";
  evals_.flush();
  curves_->AddEvaluation(line);
  if (line.value("split", std::string()) == "eval") WriteCurves();
  const std::string split = line.value("split", std::string("eval"));
  std::vector<std::pair<std::string, float>> scalars;
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [key, value] : line.items())
    if (value.is_number() && key.rfind(split + "_", 0) == 0) {
      values.emplace_back(split + "/" + key.substr(split.size() + 1), value.get<double>());
      scalars.emplace_back(values.back().first, static_cast<float>(values.back().second));
    }
  AddTensorBoardScalars(line.value("step", int64_t(0)), scalars);
  if (sink_) sink_->LogMetrics(line.value("step", int64_t(0)), values);
}

void RunLog::WriteSummary(const nlohmann::json& summary) const {
  WriteFileAtomically(dir_ + "/summary.json", summary.dump(2) + "\n");
}

ProgressLine::ProgressLine(std::string label, int64_t total, bool enabled, int64_t first)
    : label_(std::move(label)), total_(total), first_(first), enabled_(enabled && total > 0), tty_(::isatty(2)) {}

std::string ProgressLine::FormatClock(double seconds) {
  const long whole = std::lround(std::max(0.0, seconds));
  if (whole >= 3600) return fmt::format("{}:{:02d}:{:02d}", whole / 3600, whole / 60 % 60, whole % 60);
  return fmt::format("{}:{:02d}", whole / 60, whole % 60);
}

std::string ProgressLine::Clock(double elapsed_s, int64_t done, int64_t total, int64_t first) {
  const std::string left =
      done > first ? FormatClock(elapsed_s * double(total - done) / double(done - first)) : std::string("?");
  return FormatClock(elapsed_s) + "<" + left;
}

void ProgressLine::Update(int64_t done, const std::string& detail) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  int decile = static_cast<int>(10 * done / total_);
  if (tty_ && now - last_draw_ < std::chrono::milliseconds(200) && done < total_) return;
  if (!tty_ && (decile == last_decile_ || decile == 0)) return;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::string line = fmt::format("{} {}/{} ({:.0f}%) [{}] {}", label_, done, total_, 100.0 * done / total_,
                                       Clock(elapsed, done, total_, first_), detail);
  if (tty_)
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  last_draw_ = now;
  last_decile_ = decile;
}

void ProgressLine::Finish() {
  if (enabled_ && tty_) std::fprintf(stderr, "\r\033[K");
}

}  // namespace trainyard
