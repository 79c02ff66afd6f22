// curves.svg's panels (worker/report/run_curves.h): what is drawn over optimizer steps
// and over epochs, what is left out, and how long series are thinned.
#include "worker/report/run_curves.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainyard {
namespace {

const ChartSeries* Find(const ChartPanel& panel, const std::string& name) {
  for (const ChartSeries& s : panel.series)
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> Names(const ChartPanel& panel) {
  std::vector<std::string> names;
  for (const ChartSeries& s : panel.series) names.push_back(s.name);
  return names;
}

EpochRow OneEpoch(int64_t epoch, int64_t steps, double loss) {
  EpochRow row;
  row.epoch = epoch;
  row.steps = steps;
  row.train_loss = loss;
  row.ms_per_step = 10;
  row.samples_per_s = 100;
  return row;
}

TEST(RunCurvesTest, AOneEpochRunDrawsItsLoggedStepsAndEveryDevEvaluationOverSteps) {
  RunCurves curves;
  for (int step = 5; step <= 50; step += 5) curves.AddStep({{"step", step}, {"loss", 2.0 / step}, {"lr", 1e-3}});
  for (int step = 10; step <= 40; step += 10)
    curves.AddEvaluation({{"step", step},
                          {"split", "eval"},
                          {"eval_loss", 1.0 / step},
                          {"eval_accuracy", 0.5 + step / 100.0},
                          {"eval_f1", 0.4},
                          {"eval_perplexity", 3.0},
                          {"eval_runtime", 0.2},
                          {"eval_samples_per_second", 900.0}});
  curves.AddEvaluation({{"step", 50}, {"split", "test"}, {"test_loss", 0.1}, {"test_f1", 0.9}});
  const std::vector<ChartPanel> panels = curves.Panels({OneEpoch(1, 50, 0.3)});
  ASSERT_EQ(panels.size(), 5u);
  EXPECT_EQ(panels[0].title, "loss");
  EXPECT_EQ(panels[0].x_label, "optimizer step");
  EXPECT_EQ(Names(panels[0]), (std::vector<std::string>{"train", "dev"}));
  EXPECT_EQ(Find(panels[0], "train")->points.size(), 10u);
  EXPECT_EQ(Find(panels[0], "dev")->points.size(), 4u);
  EXPECT_EQ(Find(panels[0], "dev")->points.back(), std::make_pair(40.0, 1.0 / 40));
  EXPECT_EQ(panels[1].title, "dev metrics");
  // Perplexity, runtime and throughput are not on the metrics' 0-1 axis; the test split
  // is not a curve.
  EXPECT_EQ(Names(panels[1]), (std::vector<std::string>{"accuracy", "f1"}));
  EXPECT_EQ(Find(panels[1], "accuracy")->points.size(), 4u);
  EXPECT_EQ(panels[2].title, "learning rate");
  EXPECT_EQ(Find(panels[2], "lr")->points.size(), 10u);
  EXPECT_EQ(panels[3].x_label, "epoch");
  EXPECT_EQ(panels[4].title, "throughput");
  const std::string svg = curves.Render({OneEpoch(1, 50, 0.3)});
  EXPECT_NE(svg.find("optimizer step"), std::string::npos);
}

// An elastic job's steps name their quorum's size: each change is marked on the step
// panels, at the first step taken with the new size, and drawn as a dashed line.
TEST(RunCurvesTest, AnElasticJobsMembershipChangesAreMarkedOnTheStepPanels) {
  RunCurves curves;
  const int replicas[] = {3, 3, 2, 2, 2, 3, 3};
  for (int step = 1; step <= 7; ++step)
    curves.AddStep({{"step", step}, {"loss", 1.0}, {"lr", 1e-3}, {"replicas", replicas[step - 1]}});
  const std::vector<ChartPanel> panels = curves.Panels({OneEpoch(1, 7, 1.0)});
  for (int panel : {0, 1, 2}) {
    ASSERT_EQ(panels[panel].marks.size(), 2u) << panels[panel].title;
    EXPECT_EQ(panels[panel].marks[0].x, 3);
    EXPECT_EQ(panels[panel].marks[0].label, "3 -> 2 replicas");
    EXPECT_EQ(panels[panel].marks[1].x, 6);
    EXPECT_EQ(panels[panel].marks[1].label, "2 -> 3 replicas");
  }
  EXPECT_TRUE(panels[3].marks.empty()) << "an epoch panel";
  const std::string svg = curves.Render({OneEpoch(1, 7, 1.0)});
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(svg.find("2 -&gt; 3 replicas"), std::string::npos);

  RunCurves plain;  // no quorum named: no marks
  for (int step = 1; step <= 3; ++step) plain.AddStep({{"step", step}, {"loss", 1.0}, {"lr", 1e-3}});
  EXPECT_TRUE(plain.Panels({OneEpoch(1, 3, 1.0)})[0].marks.empty());
}

TEST(RunCurvesTest, WithoutLoggedStepsTheTrainLossIsEachEpochsAtTheStepThatEndedIt) {
  RunCurves curves;
  const std::vector<ChartPanel> panels = curves.Panels({OneEpoch(1, 7, 0.9), OneEpoch(2, 7, 0.5)});
  const ChartSeries* train = Find(panels[0], "train");
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->points, (std::vector<std::pair<double, double>>{{7, 0.9}, {14, 0.5}}));
  EXPECT_TRUE(panels[1].series.empty());  // no evaluation: the panel says "no data"
  EXPECT_TRUE(panels[2].series.empty());
}

TEST(RunCurvesTest, ALongSeriesIsThinnedToTheCapKeepingItsFirstAndLastPoints) {
  RunCurves curves;
  for (int step = 1; step <= 10001; ++step) curves.AddStep({{"step", step}, {"loss", 1.0}, {"lr", 1.0}});
  const std::vector<ChartPanel> panels = curves.Panels({});
  const ChartSeries* train = Find(panels[0], "train");
  ASSERT_NE(train, nullptr);
  EXPECT_LE(train->points.size(), RunCurves::kMaxPointsPerSeries + 1);
  EXPECT_GE(train->points.size(), RunCurves::kMaxPointsPerSeries / 2);
  EXPECT_EQ(train->points.front().first, 1.0);
  EXPECT_EQ(train->points.back().first, 10001.0);
}

TEST(RunCurvesTest, LinesWithoutANumericStepAreIgnored) {
  RunCurves curves;
  curves.AddStep({{"loss", 1.0}});
  curves.AddStep({{"step", "3"}, {"loss", 1.0}});
  curves.AddEvaluation({{"split", "eval"}, {"eval_f1", 0.3}});
  const std::vector<ChartPanel> panels = curves.Panels({});
  EXPECT_TRUE(Find(panels[0], "train")->points.empty());
  EXPECT_TRUE(panels[1].series.empty());
}

}  // namespace
}  // namespace trainyard
