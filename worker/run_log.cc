#include "worker/run_log.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "worker/atomic_file.h"

namespace trainyard {
namespace {

constexpr const char* kCsvHeader =
    "epoch,time_s,steps,ms_per_step,samples_per_s,data_wait_pct,train_loss,eval_loss,eval_acc,lr,"
    "loss_scale,skipped_steps,wait_ms,h2d_ms,forward_ms,backward_ms,optimizer_ms";

std::string CsvLine(const EpochRow& r) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer,
                "%ld,%.3f,%ld,%.3f,%.2f,%.2f,%.6f,%.6f,%.6f,%.6e,%s,%ld,%.3f,%.3f,%.3f,%.3f,%.3f",
                long(r.epoch), r.time_s, long(r.steps), r.ms_per_step, r.samples_per_s,
                r.data_wait_pct, r.train_loss, r.eval_loss, r.eval_acc, r.lr,
                r.loss_scale ? std::to_string(*r.loss_scale).c_str() : "", long(r.skipped_steps),
                r.wait_ms, r.h2d_ms, r.forward_ms, r.backward_ms, r.optimizer_ms);
  return buffer;
}

EpochRow ParseCsvLine(const std::string& line) {
  std::vector<std::string> f;
  std::stringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) f.push_back(cell);
  f.resize(17);
  auto num = [&](int i) { return f[i].empty() ? 0.0 : std::stod(f[i]); };
  EpochRow r;
  r.epoch = std::stoll(f[0]);
  r.time_s = num(1), r.steps = int64_t(num(2)), r.ms_per_step = num(3), r.samples_per_s = num(4);
  r.data_wait_pct = num(5), r.train_loss = num(6), r.eval_loss = num(7), r.eval_acc = num(8);
  r.lr = num(9);
  if (!f[10].empty()) r.loss_scale = num(10);
  r.skipped_steps = int64_t(num(11)), r.wait_ms = num(12), r.h2d_ms = num(13);
  r.forward_ms = num(14), r.backward_ms = num(15), r.optimizer_ms = num(16);
  return r;
}

}  // namespace

RunLog::RunLog(std::string run_dir, int64_t resume_epoch, int64_t resume_step) : dir_(std::move(run_dir)) {
  std::filesystem::create_directories(dir_);
  if (resume_epoch > 0) {
    LoadRows(resume_epoch);
    TrimSteps(resume_step);
  } else {
    std::filesystem::remove(dir_ + "/steps.jsonl");
  }
  WriteCsv();
  steps_.open(dir_ + "/steps.jsonl", std::ios::app);
}

void RunLog::LoadRows(int64_t before_epoch) {
  std::ifstream in(dir_ + "/epochs.csv");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    EpochRow row = ParseCsvLine(line);
    if (row.epoch < before_epoch) rows_.push_back(row);
  }
}

void RunLog::TrimSteps(int64_t up_to_step) {
  std::ifstream in(dir_ + "/steps.jsonl");
  std::string kept, line;
  while (std::getline(in, line)) {
    auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.value("step", int64_t(0)) <= up_to_step) kept += line + "\n";
  }
  WriteFileAtomically(dir_ + "/steps.jsonl", kept);
}

void RunLog::WriteCsv() const {
  std::string text = std::string(kCsvHeader) + "\n";
  for (const auto& r : rows_) text += CsvLine(r) + "\n";
  WriteFileAtomically(dir_ + "/epochs.csv", text);
}

void RunLog::PrintHeader() const {
  spdlog::info("{:<6} {:>8} {:>6} {:>8} {:>10} {:>11} {:>10} {:>9} {:>8} {:>9} {:>10}", "epoch",
               "time_s", "steps", "ms/step", "samples/s", "data_wait%", "train_loss", "eval_loss",
               "eval_acc", "lr", "loss_scale");
}

void RunLog::AddEpoch(const EpochRow& r) {
  rows_.push_back(r);
  WriteCsv();
  PrintRow(r);
}

void RunLog::PrintRow(const EpochRow& r) const {
  std::string scale = r.loss_scale ? fmt::format("{:g}", *r.loss_scale) : "-";
  spdlog::info("{:<6} {:>8.1f} {:>6} {:>8.1f} {:>10.1f} {:>11.1f} {:>10.4f} {:>9.4f} {:>8.4f} {:>9.2e} {:>10}",
               r.epoch, r.time_s, r.steps, r.ms_per_step, r.samples_per_s, r.data_wait_pct,
               r.train_loss, r.eval_loss, r.eval_acc, r.lr, scale);
}

void RunLog::AddStep(const nlohmann::json& line) {
  steps_ << line.dump() << "\n";
  steps_.flush();
}

void RunLog::WriteSummary(const nlohmann::json& summary) const {
  WriteFileAtomically(dir_ + "/summary.json", summary.dump(2) + "\n");
}

ProgressLine::ProgressLine(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled && total > 0), tty_(::isatty(2)) {}

void ProgressLine::Update(int64_t done, const std::string& detail) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  int decile = static_cast<int>(10 * done / total_);
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(200) && done < total_) return;
    std::fprintf(stderr, "\r\033[K%s %ld/%ld (%3.0f%%) %s", label_.c_str(), long(done), long(total_),
                 100.0 * done / total_, detail.c_str());
  } else {
    if (decile == last_decile_ || decile == 0) return;
    std::fprintf(stderr, "%s %ld/%ld (%d%%) %s\n", label_.c_str(), long(done), long(total_),
                 decile * 10, detail.c_str());
  }
  std::fflush(stderr);
  last_draw_ = now;
  last_decile_ = decile;
}

void ProgressLine::Finish() {
  if (enabled_ && tty_) std::fprintf(stderr, "\r\033[K");
}

}  // namespace trainyard
