#include "worker/report/svg_chart.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "worker/report/bench_report.h"
#include "worker/report/event_file.h"

namespace trainyard {
namespace {

// The stroke colours of the series of each panel (legend swatches, in order).
std::vector<std::vector<std::string>> LegendColorsPerPanel(const std::string& svg) {
  std::vector<std::vector<std::string>> panels;
  std::istringstream lines(svg);
  std::string line;
  const std::regex swatch("stroke='(#[0-9a-f]{6})' stroke-width='3'");
  std::smatch match;
  while (std::getline(lines, line)) {
    if (line.find("font-weight='bold'") != std::string::npos) panels.emplace_back();
    if (std::regex_search(line, match, swatch) && !panels.empty()) panels.back().push_back(match[1]);
  }
  return panels;
}

TEST(SvgChart, LinearTicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(LinearTicks(0, 97), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(LinearTicks(0.962, 0.981), (std::vector<double>{0.96, 0.965, 0.97, 0.975, 0.98, 0.985}));
  const std::vector<double> one = LinearTicks(5, 5);  // a single value still gets an axis
  EXPECT_LE(one.front(), 5);
  EXPECT_GE(one.back(), 5);
  EXPECT_GT(one.size(), 1u);
}

TEST(SvgChart, LogTicksArePowersOfTenWithTwoAndFiveOverFewDecades) {
  EXPECT_EQ(LogTicks(3, 4500), (std::vector<double>{1, 10, 100, 1000, 10000}));
  EXPECT_EQ(LogTicks(20, 300), (std::vector<double>{10, 20, 50, 100, 200, 500, 1000}));
}

TEST(SvgChart, LogScaleOnlyWhenPositiveValuesSpanMoreThanADecade) {
  EXPECT_EQ(ScaleFor({12, 5000}), AxisScale::kLog);
  EXPECT_EQ(ScaleFor({12, 100}), AxisScale::kLinear);
  EXPECT_EQ(ScaleFor({0, 5000}), AxisScale::kLinear);
  EXPECT_EQ(ScaleFor({}), AxisScale::kLinear);
}

TEST(SvgChart, SeriesColoursNeverRepeatWithinAPanel) {
  for (int count : {1, 3, 10, 11, 24, 60}) {
    std::set<std::string> colours;
    for (int i = 0; i < count; ++i) colours.insert(SeriesColor(i, count));
    EXPECT_EQ(colours.size(), size_t(count)) << count;
  }
}

TEST(SvgChart, PanelsHaveTicksLabelsLegendAndEscapedText) {
  ChartPanel panel{
      "a <b> & 'c'", "batch size", "sequences / s", AxisScale::kLog, AxisScale::kAuto, {1, 2, 4, 8}, {}, {}};
  for (int s = 0; s < 12; ++s)
    panel.series.push_back({"seq_len " + std::to_string(s), {{1, 10.0 + s}, {8, 5000.0 + s}}});
  const std::string svg = RenderChart({panel});
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; &apos;c&apos;"), std::string::npos);
  EXPECT_NE(svg.find("batch size (log scale)"), std::string::npos);
  EXPECT_NE(svg.find("sequences / s (log scale)"), std::string::npos);  // 10 to 5,000 spans decades
  for (const char* tick : {">1<", ">2<", ">4<", ">8<", ">10<", ">100<", ">1000<", ">10000<"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  const auto colours = LegendColorsPerPanel(svg);
  ASSERT_EQ(colours.size(), 1u);
  EXPECT_EQ(colours[0].size(), 12u);
  EXPECT_EQ(std::set<std::string>(colours[0].begin(), colours[0].end()).size(), 12u);
  ChartPanel empty;
  empty.title = "empty";
  EXPECT_NE(RenderChart({empty}).find("no data"), std::string::npos);
}

TEST(BenchReport, ThroughputHasOnePanelPerPrecisionAndMode) {
  std::vector<BenchCell> cells;
  for (const char* precision : {"fp32", "bf16"})
    for (const char* mode : {"eager", "int8"})
      for (int batch : {1, 2, 4, 8})
        for (int seq : {8, 128, 512}) {
          BenchCell c;
          c.model = "tiny";
          c.batch = batch;
          c.seq = seq;
          c.precision = precision;
          c.mode = mode;
          c.mean_ms = 0.01 * batch * seq;
          c.seqs_per_s = 1000.0 * batch / (0.01 * batch * seq);
          cells.push_back(c);
        }
  const auto dir = std::filesystem::temp_directory_path() / ("ty_bench_report_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  WriteBenchmarkReport(dir.string(), cells);
  std::ifstream in(dir / "throughput.svg");
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  for (const char* title :
       {"throughput, fp32 / eager", "throughput, fp32 / int8", "throughput, bf16 / eager", "throughput, bf16 / int8"})
    EXPECT_NE(svg.find(title), std::string::npos) << title;
  for (const auto& panel : LegendColorsPerPanel(svg)) {
    EXPECT_EQ(panel.size(), 3u);  // a line per seq_len
    EXPECT_EQ(std::set<std::string>(panel.begin(), panel.end()).size(), panel.size());
  }
}

TEST(EventFile, MaskedCrcMatchesTensorBoards) {
  // Values from tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c.
  EXPECT_EQ(MaskedCrc32c("", 0), 0xa282ead8u);
  EXPECT_EQ(MaskedCrc32c("123456789", 9), 0xc78ab0e5u);
}

}  // namespace
}  // namespace trainyard
