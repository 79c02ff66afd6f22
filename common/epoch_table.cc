#include "common/epoch_table.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

namespace trainyard {
namespace {

class Columns {
 public:
  Columns(const std::vector<std::string>& header, const std::vector<std::string>& cells)
      : header_(header), cells_(cells) {}
  std::optional<std::string> Text(const char* name) const {
    for (size_t i = 0; i < header_.size() && i < cells_.size(); ++i)
      if (header_[i] == name && !cells_[i].empty()) return cells_[i];
    return std::nullopt;
  }
  std::optional<double> Number(const char* name) const {
    const auto text = Text(name);
    if (!text) return std::nullopt;
    char* end = nullptr;
    const double value = std::strtod(text->c_str(), &end);
    return end && *end == '\0' ? std::optional<double>(value) : std::nullopt;
  }
  // `format` applied to the number, or "-".
  std::string Formatted(const char* name, const char* format) const {
    const auto value = Number(name);
    return value ? Printf(format, *value) : "-";
  }
  static std::string Printf(const char* format, double value) {
    char text[64];
    std::snprintf(text, sizeof text, format, value);
    return text;
  }

 private:
  const std::vector<std::string>& header_;
  const std::vector<std::string>& cells_;
};

std::string Line(const std::vector<std::string>& fields) {
  static const int kWidths[] = {-6, 8, 6, 8, 10, 11, 10, 9, 8, 9, 10, 6, 12, 8};
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) {
    char cell[96];
    std::snprintf(cell, sizeof cell, "%*s", kWidths[i], fields[i].c_str());
    line += (i ? " " : "") + std::string(cell);
  }
  return line;
}

// An elastic run's quorum sizes over the epoch: "3" while it held, else
// "<fewest>-<most>, <n> change(s)"; "-" for any other run.
std::string Replicas(const Columns& c) {
  const auto low = c.Number("replicas_min"), high = c.Number("replicas_max"), changes = c.Number("replica_changes");
  if (!low || !high) return "-";
  const std::string most = Columns::Printf("%.0f", *high);
  if (*low == *high && (!changes || *changes == 0)) return most;
  const double n = changes.value_or(0);
  return Columns::Printf("%.0f", *low) + "-" + most + ", " + Columns::Printf("%.0f", n) +
         (n == 1 ? " change" : " changes");
}

}  // namespace

std::string EpochTableHeader() {
  return Line({"epoch", "time_s", "steps", "ms/step", "samples/s", "data_wait%", "train_loss", "eval_loss", "eval_acc",
               "lr", "loss_scale", "comm%", "slowest", "replicas"});
}

std::string EpochTableRow(const std::vector<std::string>& header, const std::vector<std::string>& cells) {
  const Columns c(header, cells);
  const auto ms = c.Number("ms_per_step"), comm = c.Number("comm_ms");
  const std::string comm_pct = ms && comm ? Columns::Printf("%.1f", *ms > 0 ? 100.0 * *comm / *ms : 0.0) : "-";
  const auto ranks = c.Number("ranks"), slowest_rank = c.Number("slowest_rank");
  const auto slowest_ms = c.Number("slowest_ms_per_step");
  std::string slowest = "-";
  // "<host>:<rank>" where the row has a slowest_host cell, else "r<rank>".
  if (ranks && *ranks > 1 && slowest_rank && slowest_ms) {
    const std::string rank = Columns::Printf("%.0f", *slowest_rank);
    const auto host = c.Text("slowest_host");
    slowest = (host ? *host + ":" + rank : "r" + rank) + " " + Columns::Printf("%.1fms", *slowest_ms);
  }
  return Line({c.Text("epoch").value_or("-"), c.Formatted("time_s", "%.1f"), c.Text("steps").value_or("-"),
               c.Formatted("ms_per_step", "%.1f"), c.Formatted("samples_per_s", "%.1f"),
               c.Formatted("data_wait_pct", "%.1f"), c.Formatted("train_loss", "%.4f"),
               c.Formatted("eval_loss", "%.4f"), c.Formatted("eval_acc", "%.4f"), c.Formatted("lr", "%.2e"),
               c.Formatted("loss_scale", "%g"), comm_pct, slowest, Replicas(c)});
}

}  // namespace trainyard
