#include "worker/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace trainyard {
namespace {

// Panel layout in pixels: margins around the plot area, the legend's rows.
constexpr int kLeft = 80, kRight = 200, kTop = 36, kBottom = 50, kLegendRow = 16;

const char* const kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kPaletteSize = 10;

std::string HslToHex(double hue, double saturation, double lightness) {
  const double c = (1 - std::abs(2 * lightness - 1)) * saturation;
  const double h = std::fmod(hue, 360.0) / 60.0;
  const double x = c * (1 - std::abs(std::fmod(h, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  if (h < 1) {
    r = c;
    g = x;
  } else if (h < 2) {
    r = x;
    g = c;
  } else if (h < 3) {
    g = c;
    b = x;
  } else if (h < 4) {
    g = x;
    b = c;
  } else if (h < 5) {
    r = x;
    b = c;
  } else {
    r = c;
    b = x;
  }
  const double m = lightness - c / 2;
  auto byte = [&](double v) { return static_cast<int>(std::lround(std::clamp(v + m, 0.0, 1.0) * 255)); };
  return fmt::format("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b));
}

bool Usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

std::string FormatTick(double v) { return v == 0 ? "0" : fmt::format("{:g}", v); }

// One axis of a panel: its range, scale and ticks.
struct Axis {
  bool log = false;
  double lo = 0, hi = 1;
  std::vector<double> ticks;

  double Fraction(double v) const {
    const double f = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return std::clamp(f, 0.0, 1.0);
  }
};

Axis MakeAxis(const std::vector<double>& values, AxisScale scale, const std::vector<double>& fixed_ticks) {
  Axis axis;
  axis.log = scale == AxisScale::kLog || (scale == AxisScale::kAuto && ScaleFor(values) == AxisScale::kLog);
  std::vector<double> usable;
  for (double v : values)
    if (Usable(v, axis.log)) usable.push_back(v);
  for (double t : fixed_ticks)
    if (Usable(t, axis.log)) axis.ticks.push_back(t);
  if (usable.empty() && axis.ticks.empty()) usable = axis.log ? std::vector<double>{1, 10} : std::vector<double>{0, 1};
  double lo = usable.empty() ? axis.ticks.front() : *std::min_element(usable.begin(), usable.end());
  double hi = usable.empty() ? axis.ticks.back() : *std::max_element(usable.begin(), usable.end());
  if (axis.ticks.empty()) axis.ticks = axis.log ? LogTicks(lo, hi) : LinearTicks(lo, hi);
  lo = std::min(lo, *std::min_element(axis.ticks.begin(), axis.ticks.end()));
  hi = std::max(hi, *std::max_element(axis.ticks.begin(), axis.ticks.end()));
  if (!(hi > lo)) {  // one value: centre it
    if (axis.log) {
      lo /= 2;
      hi *= 2;
    } else {
      const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.5;
      lo -= pad;
      hi += pad;
    }
  }
  axis.lo = lo;
  axis.hi = hi;
  return axis;
}

// The plot area of a panel, in pixels.
struct Frame {
  double x0, x1, y0, y1;
  double X(const Axis& a, double v) const { return x0 + a.Fraction(v) * (x1 - x0); }
  double Y(const Axis& a, double v) const { return y1 - a.Fraction(v) * (y1 - y0); }
};

std::string AxisLabel(const std::string& label, const Axis& axis) {
  return XmlEscape(label + (axis.log ? " (log scale)" : ""));
}

std::string DrawAxes(const Frame& f, const Axis& x, const Axis& y, const ChartPanel& panel) {
  std::string out;
  for (double t : x.ticks) {
    const double px = f.X(x, t);
    out +=
        fmt::format("<line x1='{0:.1f}' y1='{1:.1f}' x2='{0:.1f}' y2='{2:.1f}' stroke='#e4e4e4'/>\n", px, f.y0, f.y1);
    out +=
        fmt::format("<line x1='{0:.1f}' y1='{1:.1f}' x2='{0:.1f}' y2='{2:.1f}' stroke='black'/>\n", px, f.y1, f.y1 + 5);
    out += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{}</text>\n", px, f.y1 + 18, FormatTick(t));
  }
  for (double t : y.ticks) {
    const double py = f.Y(y, t);
    out +=
        fmt::format("<line x1='{1:.1f}' y1='{0:.1f}' x2='{2:.1f}' y2='{0:.1f}' stroke='#e4e4e4'/>\n", py, f.x0, f.x1);
    out +=
        fmt::format("<line x1='{1:.1f}' y1='{0:.1f}' x2='{2:.1f}' y2='{0:.1f}' stroke='black'/>\n", py, f.x0 - 5, f.x0);
    out += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='end'>{}</text>\n", f.x0 - 8, py + 4, FormatTick(t));
  }
  out += fmt::format("<line x1='{0:.1f}' y1='{1:.1f}' x2='{2:.1f}' y2='{1:.1f}' stroke='black'/>\n", f.x0, f.y1, f.x1);
  out += fmt::format("<line x1='{0:.1f}' y1='{1:.1f}' x2='{0:.1f}' y2='{2:.1f}' stroke='black'/>\n", f.x0, f.y0, f.y1);
  out += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{}</text>\n", (f.x0 + f.x1) / 2, f.y1 + 38,
                     AxisLabel(panel.x_label, x));
  const double mid = (f.y0 + f.y1) / 2;
  out += fmt::format("<text x='16' y='{0:.1f}' text-anchor='middle' transform='rotate(-90 16 {0:.1f})'>{1}</text>\n",
                     mid, AxisLabel(panel.y_label, y));
  return out;
}

std::string DrawSeries(const Frame& f, const Axis& x, const Axis& y, const ChartPanel& panel) {
  std::string out;
  const int count = static_cast<int>(panel.series.size());
  bool any = false;
  for (int i = 0; i < count; ++i) {
    const ChartSeries& s = panel.series[i];
    const std::string color = SeriesColor(i, count);
    std::vector<std::pair<double, double>> points;
    for (const auto& [px, py] : s.points)
      if (Usable(px, x.log) && Usable(py, y.log)) points.emplace_back(px, py);
    std::sort(points.begin(), points.end());
    std::string path;
    for (const auto& [px, py] : points) {
      path += fmt::format("{:.1f},{:.1f} ", f.X(x, px), f.Y(y, py));
      out += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3' fill='{}'/>\n", f.X(x, px), f.Y(y, py), color);
    }
    if (points.size() > 1)
      out += fmt::format("<polyline fill='none' stroke='{}' stroke-width='2' points='{}'/>\n", color, path);
    any = any || !points.empty();
    const double ly = f.y0 + 8 + i * kLegendRow;
    out += fmt::format("<line x1='{0:.1f}' y1='{1:.1f}' x2='{2:.1f}' y2='{1:.1f}' stroke='{3}' stroke-width='3'/>\n",
                       f.x1 + 14, ly, f.x1 + 34, color);
    out += fmt::format("<text x='{:.1f}' y='{:.1f}'>{}</text>\n", f.x1 + 40, ly + 4, XmlEscape(s.name));
  }
  if (!any)
    out += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle' fill='#777'>no data</text>\n",
                       (f.x0 + f.x1) / 2, (f.y0 + f.y1) / 2);
  return out;
}

// Each mark a dashed line; labelled while few enough to read (the first kLabelledMarks).
std::string DrawMarks(const Frame& f, const Axis& x, const ChartPanel& panel) {
  constexpr size_t kLabelledMarks = 12;
  std::string out;
  for (size_t i = 0; i < panel.marks.size(); ++i) {
    const ChartMark& mark = panel.marks[i];
    if (!Usable(mark.x, x.log) || mark.x < x.lo || mark.x > x.hi) continue;
    const double px = f.X(x, mark.x);
    out += fmt::format(
        "<line x1='{0:.1f}' y1='{1:.1f}' x2='{0:.1f}' y2='{2:.1f}' stroke='#d62728' "
        "stroke-dasharray='4 3'><title>{3}</title></line>\n",
        px, f.y0, f.y1, XmlEscape(mark.label));
    if (panel.marks.size() <= kLabelledMarks)
      out += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='10' fill='#d62728'>{}</text>\n", px + 3,
                         f.y0 + 10 + 11 * double(i % 3), XmlEscape(mark.label));
  }
  return out;
}

std::string DrawPanel(const ChartPanel& panel, int top, int width, int height) {
  std::vector<double> xs, ys;
  for (const auto& s : panel.series)
    for (const auto& [x, y] : s.points) {
      xs.push_back(x);
      ys.push_back(y);
    }
  const Axis x = MakeAxis(xs, panel.x_scale, panel.x_ticks);
  const Axis y = MakeAxis(ys, panel.y_scale, {});
  const Frame f{double(kLeft), double(width - kRight), double(top + kTop), double(top + height - kBottom)};
  std::string out = fmt::format("<text x='{}' y='{}' font-size='14' font-weight='bold'>{}</text>\n", kLeft, top + 22,
                                XmlEscape(panel.title));
  return out + DrawAxes(f, x, y, panel) + DrawSeries(f, x, y, panel) + DrawMarks(f, x, panel);
}

}  // namespace

std::vector<double> LinearTicks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  const double step = magnitude * (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10);
  const double first = std::floor(lo / step) * step, last = std::ceil(hi / step) * step;
  std::vector<double> ticks;
  const auto n = static_cast<int>(std::lround((last - first) / step));
  for (int i = 0; i <= n; ++i) {
    const double t = first + i * step;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::vector<double> LogTicks(double lo, double hi) {
  if (!(lo > 0) || !std::isfinite(lo) || !std::isfinite(hi)) return {1, 10};
  const int first = static_cast<int>(std::floor(std::log10(lo)));
  const int last = std::max(first + 1, static_cast<int>(std::ceil(std::log10(std::max(hi, lo)))));
  const bool fine = last - first < 3;
  std::vector<double> ticks;
  for (int e = first; e <= last; ++e) {
    const double power = std::pow(10.0, e);
    ticks.push_back(power);
    if (fine && e < last) {
      ticks.push_back(2 * power);
      ticks.push_back(5 * power);
    }
  }
  return ticks;
}

AxisScale ScaleFor(const std::vector<double>& values) {
  double lo = 0, hi = 0;
  bool seen = false;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    if (v <= 0) return AxisScale::kLinear;
    lo = seen ? std::min(lo, v) : v;
    hi = seen ? std::max(hi, v) : v;
    seen = true;
  }
  return seen && hi > 10 * lo ? AxisScale::kLog : AxisScale::kLinear;
}

std::string SeriesColor(int index, int count) {
  if (count <= kPaletteSize) return kPalette[index % kPaletteSize];
  return HslToHex(360.0 * index / count, 0.65, 0.45);
}

std::string RenderChart(const std::vector<ChartPanel>& panels, int width, int panel_height) {
  std::string body;
  int top = 0;
  for (const ChartPanel& panel : panels) {
    const int legend = kTop + 16 + static_cast<int>(panel.series.size()) * kLegendRow + kBottom;
    const int height = std::max(panel_height, legend);
    body += DrawPanel(panel, top, width, height);
    top += height;
  }
  return fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{0}' height='{1}' viewBox='0 0 {0} {1}' "
      "font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n{2}</svg>\n",
      width, std::max(top, 40), body);
}

std::string XmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace trainyard
