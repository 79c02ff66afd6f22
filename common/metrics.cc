#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace trainyard {
namespace {

// Label values escape backslash, double quote and newline.
std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

std::string LabelText(const MetricLabels& labels, const std::string& extra_key = "",
                      const std::string& extra_value = "") {
  MetricLabels all = labels;
  if (!extra_key.empty()) all.emplace_back(extra_key, extra_value);
  if (all.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < all.size(); ++i) out += (i ? "," : "") + all[i].first + "=\"" + Escape(all[i].second) + "\"";
  return out + "}";
}

std::string Number(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest form that reads back as the same double ("0.1", not 0.10000000000000001).
  for (int digits = 15; digits <= 17; ++digits) {
    std::ostringstream out;
    out.precision(digits);
    out << value;
    if (digits == 17 || std::stod(out.str()) == value) return out.str();
  }
  return "";
}

}  // namespace

void Metrics::DeclareCounter(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mutex_);
  families_[name] = Family{"counter", help, {}, {}, {}};
}

void Metrics::DeclareGauge(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mutex_);
  families_[name] = Family{"gauge", help, {}, {}, {}};
}

void Metrics::DeclareHistogram(const std::string& name, const std::string& help, std::vector<double> bounds) {
  std::sort(bounds.begin(), bounds.end());
  std::lock_guard<std::mutex> lock(mutex_);
  families_[name] = Family{"histogram", help, std::move(bounds), {}, {}};
}

Metrics::Family& Metrics::Named(const std::string& name) {
  auto it = families_.find(name);
  if (it == families_.end()) throw std::logic_error("metric not declared: " + name);
  return it->second;
}

void Metrics::Add(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  Named(name).values[labels] += value;
}

void Metrics::Set(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  Named(name).values[labels] = value;
}

void Metrics::Observe(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& family = Named(name);
  Histogram& h = family.histograms[labels];
  if (h.counts.empty()) h.counts.assign(family.bounds.size() + 1, 0);
  const size_t bucket = std::lower_bound(family.bounds.begin(), family.bounds.end(), value) - family.bounds.begin();
  ++h.counts[bucket];
  h.sum += value;
  ++h.count;
}

void Metrics::ObserveFolded(const std::string& name, const MetricLabels& labels,
                            const std::map<double, int64_t>& by_upper_bound, double sum, int64_t count) {
  if (count <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  Family& family = Named(name);
  Histogram& h = family.histograms[labels];
  if (h.counts.empty()) h.counts.assign(family.bounds.size() + 1, 0);
  for (const auto& [bound, n] : by_upper_bound) {
    const size_t bucket = std::lower_bound(family.bounds.begin(), family.bounds.end(), bound) - family.bounds.begin();
    h.counts[bucket] += uint64_t(n);
  }
  h.sum += sum;
  h.count += uint64_t(count);
}

std::string Metrics::Render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  for (const auto& [name, family] : families_) {
    out << "# HELP " << name << " " << family.help << "\n# TYPE " << name << " " << family.type << "\n";
    for (const auto& [labels, value] : family.values) out << name << LabelText(labels) << " " << Number(value) << "\n";
    for (const auto& [labels, h] : family.histograms) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i < h.counts.size(); ++i) {
        cumulative += h.counts[i];
        const std::string le = i < family.bounds.size() ? Number(family.bounds[i]) : "+Inf";
        out << name << "_bucket" << LabelText(labels, "le", le) << " " << cumulative << "\n";
      }
      out << name << "_sum" << LabelText(labels) << " " << Number(h.sum) << "\n";
      out << name << "_count" << LabelText(labels) << " " << h.count << "\n";
    }
  }
  return out.str();
}

}  // namespace trainyard
