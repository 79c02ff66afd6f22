// Line charts as standalone SVG, for the reports users open in a browser or an image
// viewer: benchmark throughput (bench_report.h) and a run's epoch curves (run_log.h).
//
// Every panel has both axes drawn with ticks, tick labels and an axis label, light grid
// lines at the ticks, a title and a legend. An axis is logarithmic when asked, or, with
// AxisScale::kAuto, when its positive values span more than a decade (so a 10 seq/s and a
// 5,000 seq/s line both stay readable). Within a panel no two series share a colour:
// the first ten take a fixed palette, more take evenly spaced hues. Torch-free.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace trainyard {

enum class AxisScale { kAuto, kLinear, kLog };

struct ChartSeries {
  std::string name;
  // (x, y); non-finite points, and on a log axis non-positive ones, are left out.
  std::vector<std::pair<double, double>> points;
};

// Something that happened at `x` (a membership change of an elastic job's replicas): a
// dashed vertical line across the panel, labelled at its top.
struct ChartMark {
  double x = 0;
  std::string label;
};

struct ChartPanel {
  std::string title, x_label, y_label;
  AxisScale x_scale = AxisScale::kLinear, y_scale = AxisScale::kAuto;
  std::vector<double> x_ticks;  // where given (batch sizes, epochs), these instead of computed ones
  std::vector<ChartSeries> series;
  std::vector<ChartMark> marks;  // drawn where inside the x axis's range
};

// Tick positions: for a linear axis about `target` round values (1, 2 or 5 times a power
// of ten apart) covering [lo, hi]; for a log axis the powers of ten covering it, with 2
// and 5 times them in between when it spans fewer than three decades.
std::vector<double> LinearTicks(double lo, double hi, int target = 5);
std::vector<double> LogTicks(double lo, double hi);

// kLog when the positive values span more than a decade (max > 10 x min), else kLinear.
AxisScale ScaleFor(const std::vector<double>& values);

// Colour `index` of a panel with `count` series, as "#rrggbb"; distinct for every
// index < count.
std::string SeriesColor(int index, int count);

// The panels stacked vertically in one SVG document, `width` wide, each `panel_height`
// tall (more when the legend needs it). A panel without any point says "no data".
std::string RenderChart(const std::vector<ChartPanel>& panels, int width = 760, int panel_height = 300);

// `text` with &, <, >, ' and " escaped for SVG/XML.
std::string XmlEscape(const std::string& text);

}  // namespace trainyard
