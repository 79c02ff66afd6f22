#include "coordinator/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/source_path.h"

namespace trainyard {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<RungResult> Results(const std::vector<double>& values) {
  std::vector<RungResult> out;
  for (size_t i = 0; i < values.size(); ++i) out.push_back({int(i + 1), values[i], false});
  return out;
}

TEST(AshaTest, TheFirstAlwaysGoesOnThenTheTopOneInEta) {
  EXPECT_TRUE(AshaPromotes({}, 0.1, true, 3));
  EXPECT_TRUE(AshaPromotes(Results({0.5}), 0.6, true, 3));
  EXPECT_FALSE(AshaPromotes(Results({0.5}), 0.4, true, 3));
  EXPECT_FALSE(AshaPromotes(Results({0.5}), 0.5, true, 3));  // an earlier equal result ranks first
  // n = 6: the best 2 go on.
  EXPECT_TRUE(AshaPromotes(Results({0.9, 0.1, 0.2, 0.3, 0.4}), 0.5, true, 3));
  EXPECT_FALSE(AshaPromotes(Results({0.9, 0.8, 0.2, 0.3, 0.4}), 0.5, true, 3));
  // Minimizing, and eta 2 (n = 4: the best 2).
  EXPECT_TRUE(AshaPromotes(Results({0.2, 0.5, 0.9}), 0.3, false, 2));
  EXPECT_FALSE(AshaPromotes(Results({0.2, 0.1, 0.9}), 0.3, false, 2));
}

TEST(AshaTest, NaNIsTheWorst) {
  EXPECT_FALSE(AshaPromotes({}, kNaN, true, 3));
  EXPECT_TRUE(AshaPromotes(Results({kNaN}), 0.0, true, 3));
  EXPECT_TRUE(AshaPromotes(Results({kNaN, kNaN}), -1.0, false, 3));
  EXPECT_TRUE(Better(1.0, kNaN, true));
  EXPECT_FALSE(Better(kNaN, 1.0, false));
}

TEST(AshaTest, MetricOfReadsTheNamedColumn) {
  EXPECT_DOUBLE_EQ(MetricOf("epoch,train_loss,eval_acc", "3,0.5,0.912000", "eval_acc"), 0.912);
  EXPECT_TRUE(std::isnan(MetricOf("epoch,eval_acc", "3,", "eval_acc")));
  EXPECT_TRUE(std::isnan(MetricOf("epoch,eval_acc", "3,nan", "eval_acc")));
  EXPECT_TRUE(std::isnan(MetricOf("epoch,eval_acc", "3,0.5x", "eval_acc")));
  EXPECT_TRUE(std::isnan(MetricOf("epoch", "3", "eval_acc")));
}

// One trial's full run: its eval_acc after each epoch (index 0 is epoch 1).
using FullRuns = std::map<int, std::vector<double>>;

// tests/coordinator/data/asha_langid_full_runs.csv: "trial,lr,epoch,eval_acc" rows, after
// '#' lines that say where they came from (scripts/bench/search.sh --record).
FullRuns ReadFullRuns(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  FullRuns runs;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      EXPECT_EQ(line, "trial,lr,epoch,eval_acc");
      header = false;
      continue;
    }
    std::istringstream fields(line);
    std::string trial, lr, epoch, acc;
    std::getline(fields, trial, ',');
    std::getline(fields, lr, ',');
    std::getline(fields, epoch, ',');
    std::getline(fields, acc, ',');
    std::vector<double>& curve = runs[std::stoi(trial)];
    EXPECT_EQ(std::stoi(epoch), int(curve.size()) + 1) << line;
    curve.push_back(std::stod(acc));
  }
  return runs;
}

// The epoch each trial stops at under Note [ASHA] (0: it runs to the end), the trials
// arriving one at a time in order, as search_test.py's search does (max_concurrent 1).
std::map<int, int> AshaStops(const FullRuns& runs, const std::vector<int>& rungs, int eta) {
  std::map<int, std::vector<RungResult>> recorded;
  std::map<int, int> stopped;
  for (const auto& [trial, curve] : runs) {
    stopped[trial] = 0;
    for (int rung : rungs) {
      const double value = curve.at(rung - 1);
      const bool promoted = AshaPromotes(recorded[rung], value, true, eta);
      recorded[rung].push_back({trial, value, promoted});
      if (!promoted) {
        stopped[trial] = rung;
        break;
      }
    }
  }
  return stopped;
}

double BestOf(const std::vector<double>& curve, int epochs) {
  return *std::max_element(curve.begin(), curve.begin() + epochs);
}

// What ASHA's decisions are worth, on twelve langid trials run to the end and recorded
// (learning rates log-uniform over [1e-5, 1e-1], 9 epochs, rungs at 1 and 3, eta 3): the
// claims search_test.py asha --reference makes against live full runs, here on the
// coordinator's own rule without a run. The live search (ctest's search_asha) checks that
// the coordinator applies this rule to the metrics its trials log.
TEST(AshaOnRecordedRuns, StopsTheHopelessEarlyAndKeepsTheBestForHalfTheEpochs) {
  constexpr int kEpochs = 9, kEta = 3;
  const FullRuns runs = ReadFullRuns(SourcePath("tests/coordinator/data/asha_langid_full_runs.csv"));
  ASSERT_EQ(runs.size(), 12u);
  for (const auto& [trial, curve] : runs) ASSERT_EQ(curve.size(), size_t(kEpochs)) << "trial " << trial;
  const std::map<int, int> stopped = AshaStops(runs, {1, 3}, kEta);
  // The decisions search_test.py's own implementation of the rule gave over these runs
  // when they were recorded: eight trials stop at the first rung, four run to the end.
  const std::map<int, int> independent = {{1, 0}, {2, 1}, {3, 0}, {4, 0},  {5, 1},  {6, 0},
                                          {7, 1}, {8, 1}, {9, 1}, {10, 1}, {11, 1}, {12, 1}};
  EXPECT_EQ(stopped, independent);

  double best_full = 0;
  for (const auto& [trial, curve] : runs) best_full = std::max(best_full, BestOf(curve, kEpochs));
  // Hopeless: a full run that never reaches half the best accuracy. The first trial at a
  // rung always goes on; every later hopeless one stops early.
  int hopeless = 0;
  for (const auto& [trial, curve] : runs) {
    if (BestOf(curve, kEpochs) >= 0.5 * best_full) continue;
    ++hopeless;
    EXPECT_TRUE(trial == 1 || stopped.at(trial) > 0) << "hopeless trial " << trial << " ran to the end";
  }
  EXPECT_GT(hopeless, 0) << "the recording holds no hopeless trial: it checks nothing of the kind";
  // The search's best trial is the best of those it ran to the end.
  double best_kept = 0;
  int trained = 0;
  for (const auto& [trial, curve] : runs) {
    const int epochs = stopped.at(trial) ? stopped.at(trial) : kEpochs;
    trained += epochs;
    if (!stopped.at(trial)) best_kept = std::max(best_kept, BestOf(curve, kEpochs));
  }
  EXPECT_GE(best_kept, best_full - 0.005);
  EXPECT_LE(trained, 12 * kEpochs / 2);
}

}  // namespace
}  // namespace trainyard
