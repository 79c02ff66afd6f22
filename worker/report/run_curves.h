// curves.svg, the picture of a run a user opens while it trains: the figures over
// optimizer steps (train loss and learning rate from steps.jsonl's lines, the dev
// evaluations from evals.jsonl's), so a one-epoch run with evaluations every N steps
// draws lines, and the per-epoch aggregates (the step's parts, throughput) over epochs.
// Torch-free.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "worker/report/run_log.h"
#include "worker/report/svg_chart.h"

namespace trainyard {

class RunCurves {
 public:
  // A steps.jsonl line: its "loss" and "lr" at its "step". An elastic job's line names
  // its quorum's size ("replicas"): where that changes, the step panels mark it.
  void AddStep(const nlohmann::json& line);
  // An evals.jsonl line. Only the dev set's ("split": "eval") are drawn: the test split is
  // evaluated once, at the end, and summary.json has it.
  void AddEvaluation(const nlohmann::json& line);
  // The SVG document. `rows` are the epochs so far; where no step was logged (a run
  // shorter than log.steps_every) the train loss is each epoch's, at its last step.
  std::string Render(const std::vector<EpochRow>& rows) const { return RenderChart(Panels(rows)); }
  // Its panels, top to bottom: loss, dev metrics and learning rate over optimizer steps;
  // time per step and throughput over epochs.
  std::vector<ChartPanel> Panels(const std::vector<EpochRow>& rows) const;

  // At most this many points of a series are drawn: longer ones keep every k-th point
  // and their last, so a run logging every step stays a small file.
  static constexpr size_t kMaxPointsPerSeries = 2000;

 private:
  using Points = std::vector<std::pair<double, double>>;
  Points train_loss_, learning_rate_;
  int replicas_ = 0;                                 // the last step's quorum size; 0: none named
  std::vector<ChartMark> membership_;                // where it changed: "3 -> 2 replicas"
  std::vector<std::pair<std::string, Points>> dev_;  // by metric ("eval_f1"), in first-seen order
};

}  // namespace trainyard
