// What a benchmark job writes to runs/<job>/: benchmark.csv (every cell),
// benchmark.md (tables shaped like a spreadsheet: rows model/batch, columns seq_len,
// one table per precision and mode), latency_heatmap.svg (batch x seq per precision
// and mode, with its colour key) and throughput.svg (a panel per precision and mode:
// sequences/s against batch, a line per seq_len; svg_chart.h). Generate cells show
// time to first token and decoded tokens/s in the tables, ms per decode step in the
// heatmap and decoded tokens/s in the chart, a line per prompt length. No libtorch here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainyard {

struct BenchCell {
  std::string model;  // preset name or model folder
  int batch = 0, seq = 0;
  std::string precision, mode;  // fp32|bf16|fp16; eager|torchscript|cuda_graph|int8|aoti|train_step|
                                //   generate|generate_cuda_graph
  std::string status = "ok";    // ok | OOM | N/A
  std::string note;             // why a cell is N/A or OOM
  double mean_ms = 0, p50_ms = 0, p90_ms = 0, p99_ms = 0, cv = 0;
  double seqs_per_s = 0, tokens_per_s = 0, peak_mb = 0;
  // generate cells: the median time to the first token; their latencies are per decode
  // step, tokens_per_s counts decoded tokens and seqs_per_s whole generations.
  double first_token_ms = 0;
  int measurements = 0;   // timed passes (re-measured when noisy)
  bool unstable = false;  // still noisier than max_cv after the last pass
  int rank = 0;           // the rank that measured it
};

// Writes the four report files; throws std::runtime_error if a file cannot be written.
void WriteBenchmarkReport(const std::string& dir, const std::vector<BenchCell>& cells);

// The cell as one line for the console.
std::string DescribeCell(const BenchCell& cell);

}  // namespace trainyard
