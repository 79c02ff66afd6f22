// A run's own files (worker/report/run_log.h): what a fresh run writes, what a resume
// keeps and drops (Note [Resume], step 5), what reading a finished run leaves (all of
// it), and what a metric sink is handed.
#include "worker/report/run_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/scratch_dir.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Lines(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

EpochRow Row(int64_t epoch) {
  EpochRow row;
  row.epoch = epoch;
  row.time_s = 1.5 * double(epoch);
  row.steps = 10;
  row.train_loss = 1.0 / double(epoch);
  row.eval_loss = 0.9 / double(epoch);
  row.eval_acc = 0.5 + 0.1 * double(epoch);
  row.lr = 1e-3;
  return row;
}

nlohmann::json Evaluation(int64_t step) {
  return {{"step", step},
          {"epoch", double(step) / 10},
          {"split", "eval"},
          {"eval_loss", 1.0 / double(step)},
          {"eval_f1", 0.5}};
}

// The points drawn in curves.svg's panel titled `title`.
int PointsInPanel(const std::string& svg, const std::string& title) {
  const std::string heading = "font-weight='bold'>" + title + "<";
  const size_t begin = svg.find(heading);
  if (begin == std::string::npos) return -1;
  const size_t end = std::min(svg.size(), svg.find("font-weight='bold'", begin + heading.size()));
  int points = 0;
  for (size_t at = svg.find("<circle", begin); at < end; at = svg.find("<circle", at + 1)) ++points;
  return points;
}

// A finished three-epoch run of ten steps an epoch, evaluated every 5 steps, as a
// trainer leaves it.
void WriteRun(const std::string& dir) {
  RunLog log(dir, 0, 0);
  for (int64_t epoch = 1; epoch <= 3; ++epoch) {
    for (int64_t step = (epoch - 1) * 10 + 1; step <= epoch * 10; ++step) {
      log.AddStep({{"step", step}, {"epoch", epoch}, {"loss", 2.0 / double(step)}});
      if (step % 5 == 0) log.AddEvaluation(Evaluation(step));
    }
    log.AddEpoch(Row(epoch));
  }
  log.WriteSummary({{"status", "succeeded"}, {"global_step", 30}});
}

// Records what a run log hands its sink.
struct RecordingSink : MetricSink {
  struct Seen {
    std::vector<std::pair<int64_t, std::string>> metrics;  // (step, name)
    std::vector<std::string> artifacts;
    std::string closed;
  };
  explicit RecordingSink(std::shared_ptr<Seen> seen) : seen(std::move(seen)) {}
  void LogMetrics(int64_t step, const std::vector<std::pair<std::string, double>>& values) override {
    for (const auto& [name, value] : values) seen->metrics.emplace_back(step, name);
  }
  void LogArtifacts(const std::string& folder, const std::string& path) override {
    seen->artifacts.push_back(folder + " as " + path);
  }
  void Close(const std::string& status) override { seen->closed = status; }
  std::shared_ptr<Seen> seen;
};

class RunLogTest : public ::testing::Test {
 protected:
  ScratchDir scratch_{"ty_run_log_test"};
  const fs::path dir_ = scratch_.path() / "job";  // made by the run log itself
};

TEST_F(RunLogTest, AFreshRunWritesItsRowsStepsSummaryAndTensorBoardScalars) {
  WriteRun(dir_.string());
  const std::vector<std::string> csv = Lines(dir_ / "epochs.csv");
  ASSERT_EQ(csv.size(), 4u);
  EXPECT_EQ(csv[0], EpochCsvHeader());
  for (int64_t epoch = 1; epoch <= 3; ++epoch) EXPECT_EQ(csv[size_t(epoch)], EpochCsvLine(Row(epoch)));
  const std::vector<std::string> steps = Lines(dir_ / "steps.jsonl");
  ASSERT_EQ(steps.size(), 30u);
  EXPECT_EQ(nlohmann::json::parse(steps[29])["step"], 30);
  const std::vector<std::string> evals = Lines(dir_ / "evals.jsonl");
  ASSERT_EQ(evals.size(), 6u);
  EXPECT_EQ(nlohmann::json::parse(evals[5]), Evaluation(30));
  EXPECT_EQ(nlohmann::json::parse(Read(dir_ / "summary.json"))["global_step"], 30);
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "tb")) event_files += entry.file_size() > 0;
  EXPECT_EQ(event_files, 1);
}

TEST_F(RunLogTest, AResumeKeepsTheEarlierEpochsVerbatimAndDropsTheRest) {
  WriteRun(dir_.string());
  const std::vector<std::string> before = Lines(dir_ / "epochs.csv");
  {
    // A line a crash cut short is dropped with the steps after the resume point.
    std::ofstream(dir_ / "steps.jsonl", std::ios::app) << "{\"step\": 31, \"lo";
    RunLog resumed(dir_.string(), /*resume_epoch=*/2, /*resume_step=*/12);
    ASSERT_EQ(resumed.rows().size(), 1u);
    EXPECT_EQ(resumed.rows()[0].epoch, 1);
    EXPECT_EQ(resumed.csv_lines(), std::vector<std::string>{before[1]});
    EXPECT_EQ(Lines(dir_ / "epochs.csv"), (std::vector<std::string>{before[0], before[1]}));
    const std::vector<std::string> steps = Lines(dir_ / "steps.jsonl");
    ASSERT_EQ(steps.size(), 12u);
    EXPECT_EQ(nlohmann::json::parse(steps.back())["step"], 12);
    EXPECT_EQ(Lines(dir_ / "evals.jsonl"), (std::vector<std::string>{Evaluation(5).dump(), Evaluation(10).dump()}));
    // The resumed run goes on from there: each epoch, step and evaluation once.
    resumed.AddStep({{"step", 13}, {"loss", 0.5}});
    resumed.AddEvaluation(Evaluation(15));
    resumed.AddEpoch(Row(2));
  }
  EXPECT_EQ(Lines(dir_ / "evals.jsonl").size(), 3u);
  const std::vector<std::string> after = Lines(dir_ / "epochs.csv");
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(after[1], before[1]);
  EXPECT_EQ(after[2], EpochCsvLine(Row(2)));
  EXPECT_EQ(Lines(dir_ / "steps.jsonl").size(), 13u);
  // curves.svg draws the kept steps and evaluations with the new ones: 13 train losses
  // and 3 dev losses, 3 F1 values.
  const std::string curves = Read(dir_ / "curves.svg");
  EXPECT_EQ(PointsInPanel(curves, "loss"), 13 + 3);
  EXPECT_EQ(PointsInPanel(curves, "dev metrics"), 3);
}

// Every file under `dir`, by path, with its bytes.
std::map<std::string, std::string> Files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) files[entry.path().string()] = Read(entry.path());
  return files;
}

TEST_F(RunLogTest, AFinishedRunIsReadWithEveryRowAndNothingWritten) {
  WriteRun(dir_.string());
  const std::map<std::string, std::string> before = Files(dir_);
  const std::vector<std::string> csv = Lines(dir_ / "epochs.csv");
  {
    const RunLog finished = RunLog::ReadFinished(dir_.string());
    ASSERT_EQ(finished.rows().size(), 3u);
    EXPECT_EQ(finished.rows()[2].epoch, 3);
    EXPECT_EQ(finished.csv_lines(), (std::vector<std::string>{csv[1], csv[2], csv[3]}));
  }
  EXPECT_EQ(Files(dir_), before) << "reading a finished run changed or added a file";
}

TEST_F(RunLogTest, AFreshRunOverAnOldFolderStartsItsFilesEmpty) {
  WriteRun(dir_.string());
  { RunLog fresh(dir_.string(), 0, 0); }
  EXPECT_EQ(Lines(dir_ / "epochs.csv"), std::vector<std::string>{EpochCsvHeader()});
  EXPECT_TRUE(Lines(dir_ / "steps.jsonl").empty());
  EXPECT_TRUE(Lines(dir_ / "evals.jsonl").empty());
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "tb")) event_files += entry.file_size() > 0;
  EXPECT_LE(event_files, 1) << "the old run's TensorBoard curves were kept";
}

TEST_F(RunLogTest, ASinkGetsStepsEpochsAndArtifactsAndIsClosedByHowTheLogEnds) {
  auto finished = std::make_shared<RecordingSink::Seen>();
  {
    RunLog log(dir_.string(), 0, 0);
    log.AttachSink(std::make_unique<RecordingSink>(finished));
    log.AddStep({{"step", 7}, {"epoch", 1}, {"loss", 0.25}, {"note", "text is not a metric"}});
    log.AddEvaluation(Evaluation(8));
    log.AddEpoch(Row(1));
    log.AddArtifacts("/runs/job/model", "model");
  }
  ASSERT_FALSE(finished->metrics.empty());
  EXPECT_EQ(finished->metrics[0], (std::pair<int64_t, std::string>{7, "train/loss"}));
  for (const auto& [step, name] : finished->metrics) EXPECT_NE(name, "train/note");
  bool epoch_metric = false;
  for (const auto& [step, name] : finished->metrics) epoch_metric |= name == "epoch/eval_acc";
  EXPECT_TRUE(epoch_metric);
  // An evaluation's metrics by HF Trainer's names, at its step; its step and epoch are not metrics.
  std::vector<std::pair<int64_t, std::string>> evaluation;
  for (const auto& seen : finished->metrics)
    if (seen.first == 8) evaluation.push_back(seen);
  EXPECT_EQ(evaluation, (std::vector<std::pair<int64_t, std::string>>{{8, "eval/f1"}, {8, "eval/loss"}}));
  EXPECT_EQ(finished->artifacts, std::vector<std::string>{"/runs/job/model as model"});
  EXPECT_EQ(finished->closed, "FINISHED");

  auto failed = std::make_shared<RecordingSink::Seen>();
  try {
    RunLog log(dir_.string(), 0, 0);
    log.AttachSink(std::make_unique<RecordingSink>(failed));
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(failed->closed, "FAILED");
}

// Off a terminal (ctest's stderr is a file) the line is printed at each tenth, with the
// elapsed time and the time left at the rate since it was made, excluding `first`.
TEST(ProgressLineTest, PrintsEachTenthWithElapsedAndTimeLeft) {
  ::testing::internal::CaptureStderr();
  {
    ProgressLine line("epoch 2/3", 20, true, /*first=*/4);
    for (int64_t done = 5; done <= 20; ++done) line.Update(done, "loss 0.5");
    line.Finish();
  }
  std::istringstream printed(::testing::internal::GetCapturedStderr());
  std::vector<std::string> lines;
  for (std::string l; std::getline(printed, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 9u) << printed.str();  // 20% ... 100%; the first tenth was done before
  EXPECT_EQ(lines.front(), "epoch 2/3 5/20 (25%) [0:00<0:00] loss 0.5");
  EXPECT_EQ(lines.back(), "epoch 2/3 20/20 (100%) [0:00<0:00] loss 0.5");
}

TEST(ProgressLineTest, ClockIsMinutesAndSecondsThenHours) {
  EXPECT_EQ(ProgressLine::FormatClock(0.4), "0:00");
  EXPECT_EQ(ProgressLine::FormatClock(61.6), "1:02");
  EXPECT_EQ(ProgressLine::FormatClock(3599.4), "59:59");
  EXPECT_EQ(ProgressLine::FormatClock(3725), "1:02:05");
  EXPECT_EQ(ProgressLine::FormatClock(-3), "0:00");
}

}  // namespace
}  // namespace trainyard
