// The server's Prometheus metrics, rendered in the text exposition format (version
// 0.0.4) on the metrics port's /metrics. Counters, gauges and histograms with labels;
// thread-safe, cheap enough to update on every request.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace trainyard {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Metrics {
 public:
  // Declares a metric (its HELP line); a name is declared once, with one type.
  void DeclareCounter(const std::string& name, const std::string& help);
  void DeclareGauge(const std::string& name, const std::string& help);
  // `bounds`: the upper bounds of the buckets, ascending; +Inf is added.
  void DeclareHistogram(const std::string& name, const std::string& help, std::vector<double> bounds);

  void Add(const std::string& name, const MetricLabels& labels, double value = 1);
  void Set(const std::string& name, const MetricLabels& labels, double value);
  void Observe(const std::string& name, const MetricLabels& labels, double value);
  // Adds observations already counted in buckets: `by_upper_bound` maps an upper bound
  // (infinity for +Inf) to how many fell at or below it and above the one before; each
  // count goes to this histogram's first bucket at or above its bound (the same bucket
  // where the bounds are the same). Nothing when `count` is 0.
  void ObserveFolded(const std::string& name, const MetricLabels& labels,
                     const std::map<double, int64_t>& by_upper_bound, double sum, int64_t count);

  std::string Render() const;

 private:
  struct Histogram {
    std::vector<uint64_t> counts;  // per bucket, not cumulative; one more for +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    std::string type, help;
    std::vector<double> bounds;
    std::map<MetricLabels, double> values;
    std::map<MetricLabels, Histogram> histograms;
  };
  Family& Named(const std::string& name);

  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

}  // namespace trainyard
