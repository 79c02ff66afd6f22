// The trace ring: bounded by its steps, newest kept, and a valid Chrome trace.
#include "common/trace_recorder.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace trainyard {
namespace {

TEST(TraceRecorder, KeepsOnlyTheLastStepsWhateverTheJobsLength) {
  TraceRecorder trace(/*keep_steps=*/3, /*spans_per_step=*/2);
  trace.SetOrigin(1000);
  for (int64_t step = 1; step <= 50; ++step) {
    trace.Span("forward", TraceRecorder::kStepTrack, step, 1000 + step * 100, 1000 + step * 100 + 40);
    trace.Span("allreduce", TraceRecorder::kCommTrack, step, 1000 + step * 100 + 10, 1000 + step * 100 + 30, 0);
  }
  const auto json = nlohmann::json::parse(ChromeTraceJson({trace.EventsJson(0), trace.EventsJson(1)}));
  std::vector<int64_t> steps;
  int metadata = 0;
  for (const auto& e : json["traceEvents"]) {
    if (e["ph"] == "M") {
      ++metadata;
      continue;
    }
    EXPECT_EQ(e["ph"], "X");
    steps.push_back(e["args"]["step"]);
    const int64_t step = e["args"]["step"];
    if (e["name"] == "forward") {
      EXPECT_EQ(e["ts"], step * 100);  // from the origin
      EXPECT_EQ(e["dur"], 40);
      EXPECT_EQ(e["tid"], TraceRecorder::kStepTrack);
    } else {
      EXPECT_EQ(e["name"], "allreduce");
      EXPECT_EQ(e["cat"], "comm");
      EXPECT_EQ(e["args"]["bucket"], 0);
    }
  }
  EXPECT_EQ(metadata, 8);  // per rank: its name, its order, two thread names
  EXPECT_EQ(steps, (std::vector<int64_t>{48, 48, 49, 49, 50, 50, 48, 48, 49, 49, 50, 50}));
}

TEST(TraceRecorder, ABackwardClockGivesAnEmptySpanNotANegativeOne) {
  TraceRecorder trace(1, 1);
  trace.Span("wait", TraceRecorder::kStepTrack, 1, 500, 400);
  const auto json = nlohmann::json::parse(ChromeTraceJson({trace.EventsJson(0)}));
  EXPECT_EQ(json["traceEvents"].back()["dur"], 0);
}

}  // namespace
}  // namespace trainyard
