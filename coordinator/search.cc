#include "coordinator/search.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "common/csv.h"

namespace trainyard {

bool Better(double a, double b, bool maximize) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return maximize ? a > b : a < b;
}

bool AshaPromotes(const std::vector<RungResult>& earlier, double value, bool maximize, int eta) {
  if (std::isnan(value)) return false;
  const size_t n = earlier.size() + 1;
  const size_t keep = std::max<size_t>(1, n / size_t(std::max(eta, 1)));
  // Earlier results at least as good as this one rank above it.
  const size_t above = std::count_if(earlier.begin(), earlier.end(),
                                     [&](const RungResult& r) { return !Better(value, r.value, maximize); });
  return above < keep;
}

double MetricOf(const std::string& csv_header, const std::string& csv_line, const std::string& metric) {
  const std::vector<std::string> header = SplitCsv(csv_header), cells = SplitCsv(csv_line);
  for (size_t i = 0; i < header.size() && i < cells.size(); ++i) {
    if (header[i] != metric) continue;
    const char* text = cells[i].c_str();
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end == text || *end != '\0' || !std::isfinite(value)) break;
    return value;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace trainyard
