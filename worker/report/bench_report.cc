#include "worker/report/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/atomic_file.h"
#include "worker/report/svg_chart.h"

namespace trainyard {
namespace {

bool IsGeneration(const std::string& mode) { return mode.rfind("generate", 0) == 0; }

std::string Csv(const std::vector<BenchCell>& cells) {
  std::string out =
      "model,batch,seq_len,precision,mode,status,mean_ms,p50_ms,p90_ms,p99_ms,cv,seqs_per_s,tokens_per_s,"
      "first_token_ms,peak_mb,measurements,unstable,rank,note\n";
  for (const auto& c : cells)
    out += fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.2f},{:.1f},{:.3f},{:.1f},{},{},{},{}\n",
                       c.model, c.batch, c.seq, c.precision, c.mode, c.status, c.mean_ms, c.p50_ms, c.p90_ms, c.p99_ms,
                       c.cv, c.seqs_per_s, c.tokens_per_s, c.first_token_ms, c.peak_mb, c.measurements,
                       c.unstable ? 1 : 0, c.rank, c.note);
  return out;
}

// A cell's mean latency (generation: per decode step), `~` when still noisy.
std::string CellText(const BenchCell& c) {
  if (c.status != "ok") return c.status;
  return fmt::format("{:.3f}{}", c.mean_ms, c.unstable ? "~" : "");
}

// A generate cell in the Markdown tables: time to first token and decoded tokens/s.
std::string GenerationText(const BenchCell& c) {
  if (c.status != "ok") return c.status;
  return fmt::format("{:.1f} ms / {:.1f} tok/s{}", c.first_token_ms, c.tokens_per_s, c.unstable ? "~" : "");
}

std::string Markdown(const std::vector<BenchCell>& cells) {
  std::map<std::pair<std::string, std::string>, std::vector<const BenchCell*>> groups;
  for (const auto& c : cells) groups[{c.precision, c.mode}].push_back(&c);
  std::string out =
      "# Benchmark\n\nMean latency in ms per batch; generate tables: time to first token, then decoded "
      "tokens/s over all rows, columns being prompt lengths (`~`: still noisy after re-measuring; "
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
    const auto text = IsGeneration(key.second) ? GenerationText : CellText;
    for (const auto& [row, by_seq] : rows) {
      out += fmt::format("| {} | {} |", row.first, row.second);
      for (int s : seqs) out += " " + (by_seq.count(s) ? text(*by_seq.at(s)) : std::string("")) + " |";
      out += "\n";
    }
  }
  return out;
}

std::string Color(double t) {  // t in [0, 1]: pale yellow to dark red
  int r = 255, g = static_cast<int>(240 - 200 * t), b = static_cast<int>(180 - 170 * t);
  return fmt::format("rgb({},{},{})", r - static_cast<int>(90 * t), std::max(g, 0), std::max(b, 0));
}

// The heatmap's colour key: the scale from the fastest to the slowest cell of a panel,
// logarithmic as the colouring is, with its end values.
std::string ColorBar(int x, int y, double lo, double hi) {
  if (!(hi > 0) || lo > hi) return "";
  std::string out;
  constexpr int kSteps = 12, kStepWidth = 16;
  for (int i = 0; i < kSteps; ++i)
    out += fmt::format("<rect x='{}' y='{}' width='{}' height='10' fill='{}'/>\n", x + i * kStepWidth, y, kStepWidth,
                       Color(double(i) / (kSteps - 1)));
  out +=
      fmt::format("<text x='{}' y='{}' font-size='11'>{:.3g} ms (fastest) to {:.3g} ms (slowest), log scale</text>\n",
                  x + kSteps * kStepWidth + 8, y + 9, lo, hi);
  return out;
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
      batches.insert(c->batch);
      seqs.insert(c->seq);
      if (c->status == "ok") {
        lo = std::min(lo, c->mean_ms);
        hi = std::max(hi, c->mean_ms);
      }
    }
    const bool generation = IsGeneration(group.front()->mode);
    const std::string heading = title + (generation ? ": ms per decode step (rows: batch size, columns: prompt length)"
                                                    : ": mean latency, ms (rows: batch size, columns: seq_len)");
    body += fmt::format("<text x='10' y='{}' font-weight='bold'>{}</text>\n", y0, XmlEscape(heading));
    width = std::max(width, 20 + static_cast<int>(heading.size()) * 8);
    body += ColorBar(10, y0 + 36 + static_cast<int>(batches.size()) * cell_h, lo, hi);
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
    y0 += 40 + static_cast<int>(batches.size()) * cell_h + 34 + gap;
  }
  return fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' "
      "font-size='13'>\n<rect width='100%' height='100%' fill='white'/>\n{}</svg>\n",
      width, y0, body);
}

// One panel per precision and mode: sequences/s against batch (log axis at the batch
// sizes measured), a line per seq_len; the y axis goes logarithmic when the lines span
// more than a decade.
std::string ThroughputChart(const std::vector<BenchCell>& cells) {
  std::map<std::pair<std::string, std::string>, std::map<int, ChartSeries>> panels;
  for (const auto& c : cells) {
    if (c.status != "ok" || c.mode == "train_step") continue;
    ChartSeries& line = panels[{c.precision, c.mode}][c.seq];
    line.name = fmt::format(IsGeneration(c.mode) ? "prompt {}" : "seq_len {}", c.seq);
    line.points.emplace_back(c.batch, IsGeneration(c.mode) ? c.tokens_per_s : c.seqs_per_s);
  }
  std::vector<ChartPanel> out;
  for (auto& [key, lines] : panels) {
    ChartPanel panel;
    panel.title = fmt::format("throughput, {} / {}", key.first, key.second);
    panel.x_label = "batch size";
    panel.y_label = IsGeneration(key.second) ? "decoded tokens / s" : "sequences / s";
    panel.x_scale = AxisScale::kLog;
    std::set<double> batches;  // the batch sizes measured, as ticks
    for (auto& [seq, line] : lines) {
      for (const auto& point : line.points) batches.insert(point.first);
      panel.series.push_back(std::move(line));
    }
    panel.x_ticks.assign(batches.begin(), batches.end());
    out.push_back(std::move(panel));
  }
  if (out.empty()) {  // nothing measured: an empty panel that says so
    out.emplace_back();
    out.back().title = "throughput";
  }
  return RenderChart(out);
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
  if (IsGeneration(c.mode))
    return fmt::format(
        "{}  first token {:9.3f} ms  step mean {:8.3f} ms  p50 {:8.3f}  p99 {:8.3f}  cv {:5.3f}{}  {:9.1f} tok/s  "
        "peak {:8.1f} MB",
        head, c.first_token_ms, c.mean_ms, c.p50_ms, c.p99_ms, c.cv, c.unstable ? " (noisy)" : "", c.tokens_per_s,
        c.peak_mb);
  return fmt::format(
      "{}  mean {:9.3f} ms  p50 {:9.3f}  p90 {:9.3f}  p99 {:9.3f}  cv {:5.3f}{}  {:9.1f} seq/s  "
      "{:10.0f} tok/s  peak {:8.1f} MB",
      head, c.mean_ms, c.p50_ms, c.p90_ms, c.p99_ms, c.cv, c.unstable ? " (noisy)" : "", c.seqs_per_s, c.tokens_per_s,
      c.peak_mb);
}

}  // namespace trainyard
