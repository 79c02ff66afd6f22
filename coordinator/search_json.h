// A search's report (wire::SearchReport) as JSON: what `jobctl report --json` prints and
// the dashboard's API serves under "search". Header-only, so jobctl needs no coordinator
// library for it.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "proto/wire_names.h"
#include "trainyard.pb.h"

namespace trainyard {

// NaN (no value) as null.
inline nlohmann::json NumberOrNull(double value) {
  return std::isnan(value) ? nlohmann::json(nullptr) : nlohmann::json(value);
}

inline nlohmann::json SearchJson(const wire::SearchReport& s) {
  nlohmann::json trials = nlohmann::json::array();
  for (const wire::TrialInfo& t : s.trials()) {
    nlohmann::json curve = nlohmann::json::array();
    for (double v : t.curve()) curve.push_back(NumberOrNull(v));
    trials.push_back({{"trial", t.trial()},
                      {"job", t.job_id()},
                      {"name", t.name()},
                      {"state", t.job_id() ? JobStateName(t.job_state()) : "PENDING"},
                      {"params", std::vector<std::string>(t.params().begin(), t.params().end())},
                      {"curve", curve},
                      {"best", NumberOrNull(t.best())},
                      {"stopped_at", t.stopped_at()},
                      {"rank_seconds", t.rank_seconds()},
                      {"model_dir", t.model_dir()}});
  }
  return {{"method", s.method()},
          {"metric", s.metric()},
          {"mode", s.maximize() ? "max" : "min"},
          {"rungs", std::vector<int>(s.rungs().begin(), s.rungs().end())},
          {"max_epochs", s.max_epochs()},
          {"max_concurrent", s.max_concurrent()},
          {"best_trial", s.best_trial()},
          {"trials", trials}};
}

}  // namespace trainyard
