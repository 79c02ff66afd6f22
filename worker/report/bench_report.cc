#include "worker/report/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/atomic_file.h"

namespace trainyard {
namespace {

std::string Csv(const std::vector<BenchCell>& cells) {
  std::string out =
      "model,batch,seq_len,precision,mode,status,mean_ms,p50_ms,p90_ms,p99_ms,cv,seqs_per_s,tokens_per_s,"
      "peak_mb,measurements,unstable,rank,note\n";
  for (const auto& c : cells)
    out +=
        fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.2f},{:.1f},{:.1f},{},{},{},{}\n", c.model,
                    c.batch, c.seq, c.precision, c.mode, c.status, c.mean_ms, c.p50_ms, c.p90_ms, c.p99_ms, c.cv,
                    c.seqs_per_s, c.tokens_per_s, c.peak_mb, c.measurements, c.unstable ? 1 : 0, c.rank, c.note);
  return out;
}

std::string CellText(const BenchCell& c) {
  if (c.status != "ok") return c.status;
  return fmt::format("{:.3f}{}", c.mean_ms, c.unstable ? "~" : "");
}

std::string Markdown(const std::vector<BenchCell>& cells) {
  std::map<std::pair<std::string, std::string>, std::vector<const BenchCell*>> groups;
  for (const auto& c : cells) groups[{c.precision, c.mode}].push_back(&c);
  std::string out =
      "# Benchmark\n\nMean latency in ms per batch (`~`: still noisy after re-measuring; "
      "`OOM`: out of memory; `N/A`: not applicable).\n";
  for (const auto& [key, group] : groups) {
    std::set<int> seqs;
    std::map<std::pair<std::string, int>, std::map<int, const BenchCell*>> rows;
    for (const BenchCell* c : group) {
      seqs.insert(c->seq);
      rows[{c->model, c->batch}][c->seq] = c;
    }
    out += fmt::format("\n## {} / {}\n\n| model | batch |", key.first, key.second);
    for (int s : seqs) out += fmt::format(" {} |", s);
    out += "\n|---|---|";
    for (size_t i = 0; i < seqs.size(); ++i) out += "---|";
    out += "\n";
    for (const auto& [row, by_seq] : rows) {
      out += fmt::format("| {} | {} |", row.first, row.second);
      for (int s : seqs) out += " " + (by_seq.count(s) ? CellText(*by_seq.at(s)) : std::string("")) + " |";
      out += "\n";
    }
  }
  return out;
}

std::string Color(double t) {  // t in [0, 1]: pale yellow to dark red
  int r = 255, g = static_cast<int>(240 - 200 * t), b = static_cast<int>(180 - 170 * t);
  return fmt::format("rgb({},{},{})", r - static_cast<int>(90 * t), std::max(g, 0), std::max(b, 0));
}

std::string Heatmap(const std::vector<BenchCell>& cells) {
  std::map<std::string, std::vector<const BenchCell*>> panels;
  for (const auto& c : cells)
    if (c.mode != "train_step") panels[c.precision + " / " + c.mode].push_back(&c);
  const int cell_w = 70, cell_h = 28, gap = 50, left = 100;  // left: room for "batch 1024"
  std::string body;
  int y0 = 30, width = 200;
  for (const auto& [title, group] : panels) {
    std::set<int> batches, seqs;
    double lo = 1e30, hi = 0;
    for (const BenchCell* c : group) {
      batches.insert(c->batch), seqs.insert(c->seq);
      if (c->status == "ok") lo = std::min(lo, c->mean_ms), hi = std::max(hi, c->mean_ms);
    }
    const std::string heading = title + " (mean ms; batch down, seq_len across)";
    body += fmt::format("<text x='10' y='{}' font-weight='bold'>{}</text>\n", y0, heading);
    width = std::max(width, 20 + static_cast<int>(heading.size()) * 8);
    int col = 0;
    for (int s : seqs) body += fmt::format("<text x='{}' y='{}'>{}</text>\n", left + col++ * cell_w + 20, y0 + 20, s);
    int row = 0;
    for (int b : batches) {
      const int y = y0 + 28 + row++ * cell_h;
      body += fmt::format("<text x='10' y='{}'>batch {}</text>\n", y + 18, b);
      col = 0;
      for (int s : seqs) {
        const int x = left + col++ * cell_w;
        auto it =
            std::find_if(group.begin(), group.end(), [&](const BenchCell* c) { return c->batch == b && c->seq == s; });
        if (it == group.end()) continue;
        const BenchCell& c = **it;
        const double t = c.status == "ok" && hi > lo ? std::log(c.mean_ms / lo) / std::log(hi / lo) : 0.0;
        body += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='{}' stroke='white'/>\n", x, y, cell_w,
                            cell_h, c.status == "ok" ? Color(t) : "#cccccc");
        body += fmt::format("<text x='{}' y='{}' font-size='11'>{}</text>\n", x + 6, y + 18, CellText(c));
      }
    }
    width = std::max(width, left + 20 + col * cell_w);
    y0 += 40 + static_cast<int>(batches.size()) * cell_h + gap;
  }
  return fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' "
      "font-size='13'>\n<rect width='100%' height='100%' fill='white'/>\n{}</svg>\n",
      width, y0, body);
}

std::string ThroughputChart(const std::vector<BenchCell>& cells) {
  std::map<std::string, std::vector<std::pair<int, double>>> lines;
  int max_batch = 1;
  double max_tp = 1;
  for (const auto& c : cells) {
    if (c.status != "ok" || c.mode == "train_step") continue;
    lines[fmt::format("{} {} seq {}", c.mode, c.precision, c.seq)].push_back({c.batch, c.seqs_per_s});
    max_batch = std::max(max_batch, c.batch), max_tp = std::max(max_tp, c.seqs_per_s);
  }
  const int w = 640, h = 360, left = 70, bottom = 40, top = 30;
  auto x_of = [&](int b) {
    return left + (w - left - 220) * std::log2(double(b)) / std::max(1.0, std::log2(double(max_batch)));
  };
  auto y_of = [&](double v) { return h - bottom - (h - bottom - top) * v / max_tp; };
  static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::string body =
      fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n", left, h - bottom, w - 220, h - bottom);
  body += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n", left, top, left, h - bottom);
  body += fmt::format("<text x='{}' y='{}'>batch (log2)</text><text x='5' y='{}'>seq/s</text>\n", w / 2 - 80, h - 8,
                      top - 10);
  body += fmt::format("<text x='{}' y='{}' font-size='11'>{:.0f}</text>\n", 5, top + 4, max_tp);
  int index = 0;
  for (auto& [name, points] : lines) {
    std::sort(points.begin(), points.end());
    std::string path;
    for (const auto& [b, v] : points) path += fmt::format("{:.1f},{:.1f} ", x_of(b), y_of(v));
    const char* color = palette[index % 8];
    body += fmt::format("<polyline fill='none' stroke='{}' stroke-width='2' points='{}'/>\n", color, path);
    body +=
        fmt::format("<text x='{}' y='{}' fill='{}' font-size='11'>{}</text>\n", w - 210, top + 14 * index, color, name);
    ++index;
  }
  for (int b = 1; b <= max_batch; b *= 2)
    body += fmt::format("<text x='{:.0f}' y='{}' font-size='11'>{}</text>\n", x_of(b) - 4, h - bottom + 15, b);
  return fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' "
      "font-size='13'>\n<rect width='100%' height='100%' fill='white'/>\n{}</svg>\n",
      w, std::max(h, top + 14 * index + 20), body);
}

}  // namespace

void WriteBenchmarkReport(const std::string& dir, const std::vector<BenchCell>& cells) {
  WriteFileAtomically(dir + "/benchmark.csv", Csv(cells));
  WriteFileAtomically(dir + "/benchmark.md", Markdown(cells));
  WriteFileAtomically(dir + "/latency_heatmap.svg", Heatmap(cells));
  WriteFileAtomically(dir + "/throughput.svg", ThroughputChart(cells));
}

std::string DescribeCell(const BenchCell& c) {
  std::string head = fmt::format("{:<6} {:<11} batch {:>4} seq {:>4}", c.precision, c.mode, c.batch, c.seq);
  if (c.status != "ok") return fmt::format("{}  {} ({})", head, c.status, c.note);
  return fmt::format(
      "{}  mean {:9.3f} ms  p50 {:9.3f}  p90 {:9.3f}  p99 {:9.3f}  cv {:5.3f}{}  {:9.1f} seq/s  "
      "{:10.0f} tok/s  peak {:8.1f} MB",
      head, c.mean_ms, c.p50_ms, c.p90_ms, c.p99_ms, c.cv, c.unstable ? " (noisy)" : "", c.seqs_per_s, c.tokens_per_s,
      c.peak_mb);
}

}  // namespace trainyard
