#include "worker/report/run_curves.h"

#include <algorithm>
#include <cmath>

namespace trainyard {

namespace {

// Figures of an evaluation line that are not a dev metric to draw on a 0-1 axis: the
// loss has its own panel, perplexity its own scale, and the rest describe the run.
bool DrawnAsDevMetric(const std::string& key) {
  static const char* const kOthers[] = {"eval_loss", "eval_perplexity", "eval_runtime", "eval_samples_per_second"};
  if (key.rfind("eval_", 0) != 0) return false;
  return std::none_of(std::begin(kOthers), std::end(kOthers), [&](const char* other) { return key == other; });
}

std::vector<std::pair<double, double>> Thinned(const std::vector<std::pair<double, double>>& points) {
  if (points.size() <= RunCurves::kMaxPointsPerSeries) return points;
  const size_t stride = (points.size() + RunCurves::kMaxPointsPerSeries - 1) / RunCurves::kMaxPointsPerSeries;
  std::vector<std::pair<double, double>> kept;
  for (size_t i = 0; i < points.size(); i += stride) kept.push_back(points[i]);
  if (kept.back() != points.back()) kept.push_back(points.back());
  return kept;
}

ChartPanel StepPanel(std::string title, std::string y_label) {
  ChartPanel panel;
  panel.title = std::move(title);
  panel.x_label = "optimizer step";
  panel.y_label = std::move(y_label);
  return panel;
}

ChartPanel EpochPanel(const std::vector<EpochRow>& rows, std::string title, std::string y_label) {
  ChartPanel panel;
  panel.title = std::move(title);
  panel.x_label = "epoch";
  panel.y_label = std::move(y_label);
  if (rows.size() <= 12)
    for (const EpochRow& r : rows) panel.x_ticks.push_back(double(r.epoch));
  return panel;
}

ChartSeries EpochSeries(const std::vector<EpochRow>& rows, std::string name, double (*value)(const EpochRow&)) {
  ChartSeries series{std::move(name), {}};
  for (const EpochRow& r : rows) series.points.emplace_back(double(r.epoch), value(r));
  return series;
}

// Each epoch's train loss at the optimizer step that ended it.
std::vector<std::pair<double, double>> EpochEndLosses(const std::vector<EpochRow>& rows) {
  std::vector<std::pair<double, double>> points;
  int64_t end_step = 0;
  for (const EpochRow& r : rows) {
    end_step += r.steps;
    points.emplace_back(double(end_step), r.train_loss);
  }
  return points;
}

ChartPanel StepTimePanel(const std::vector<EpochRow>& rows) {
  ChartPanel time = EpochPanel(rows, "time per step (median across ranks)", "ms / step");
  time.series.push_back(EpochSeries(rows, "whole step", [](const EpochRow& r) { return r.ms_per_step; }));
  for (int part = 0; part < kNumStepParts; ++part) {  // parts that never took time (comm on one rank) left out
    ChartSeries series{kStepParts[part], {}};
    for (const EpochRow& r : rows) series.points.emplace_back(double(r.epoch), r.parts[part].median);
    if (std::any_of(series.points.begin(), series.points.end(), [](const auto& p) { return p.second > 0; }))
      time.series.push_back(std::move(series));
  }
  return time;
}

}  // namespace

void RunCurves::AddStep(const nlohmann::json& line) {
  const auto number = [&](const char* key) {
    const auto it = line.find(key);
    return it != line.end() && it->is_number() ? it->get<double>() : std::nan("");
  };
  const double step = number("step");
  if (std::isnan(step)) return;
  train_loss_.emplace_back(step, number("loss"));
  learning_rate_.emplace_back(step, number("lr"));
  const double replicas = number("replicas");
  if (std::isnan(replicas)) return;
  const int now = static_cast<int>(replicas);
  if (replicas_ != 0 && now != replicas_)
    membership_.push_back({step, std::to_string(replicas_) + " -> " + std::to_string(now) + " replicas"});
  replicas_ = now;
}

void RunCurves::AddEvaluation(const nlohmann::json& line) {
  const auto step = line.find("step");
  if (line.value("split", std::string()) != "eval" || step == line.end() || !step->is_number()) return;
  for (const auto& item : line.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (!value.is_number() || (key != "eval_loss" && !DrawnAsDevMetric(key))) continue;
    auto series = std::find_if(dev_.begin(), dev_.end(), [&](const auto& s) { return s.first == key; });
    if (series == dev_.end()) series = dev_.insert(dev_.end(), {key, {}});
    series->second.emplace_back(step->get<double>(), value.get<double>());
  }
}

std::vector<ChartPanel> RunCurves::Panels(const std::vector<EpochRow>& rows) const {
  ChartPanel loss = StepPanel("loss", "cross-entropy");
  loss.series.push_back({"train", Thinned(train_loss_.empty() ? EpochEndLosses(rows) : train_loss_)});
  ChartPanel metrics = StepPanel("dev metrics", "value");
  metrics.y_scale = AxisScale::kLinear;
  for (const auto& [key, points] : dev_) {
    if (key == "eval_loss")
      loss.series.push_back({"dev", Thinned(points)});
    else
      metrics.series.push_back({key.substr(5), Thinned(points)});  // "eval_f1" is "f1"
  }
  ChartPanel lr = StepPanel("learning rate", "lr");
  lr.y_scale = AxisScale::kLinear;
  if (!learning_rate_.empty()) lr.series.push_back({"lr", Thinned(learning_rate_)});
  for (ChartPanel* panel : {&loss, &metrics, &lr}) panel->marks = membership_;
  ChartPanel speed = EpochPanel(rows, "throughput", "samples / s");
  speed.series.push_back(EpochSeries(rows, "train", [](const EpochRow& r) { return r.samples_per_s; }));
  return {loss, metrics, lr, StepTimePanel(rows), speed};
}

}  // namespace trainyard
