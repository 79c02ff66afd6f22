// RunCommand: exit codes, both streams, the environment it adds, the output cap, and a
// deadline that ends the command's whole process group.
#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>

#include "common/clock.h"

namespace trainyard {
namespace {

CommandOptions Within(double seconds) {
  CommandOptions options;
  options.timeout_s = seconds;
  return options;
}

TEST(RunCommand, KeepsBothStreamsAndTheExitCode) {
  const CommandResult r = RunCommand({"sh", "-c", "echo out; echo err >&2; exit 3"}, Within(10));
  EXPECT_TRUE(r.started);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.Describe(), "exit 3: err");
}

TEST(RunCommand, AddsTheGivenEnvironmentAndReadsNothingFromStdin) {
  CommandOptions options = Within(10);
  options.env = {{"TRAINYARD_SUBPROCESS_TEST", "a b'c"}};
  const CommandResult r = RunCommand({"sh", "-c", "printf '%s' \"$TRAINYARD_SUBPROCESS_TEST\"; cat"}, options);
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, "a b'c");
}

TEST(RunCommand, SaysWhyACommandCannotStart) {
  const CommandResult r = RunCommand({"/nonexistent/trainyard-no-such-command"}, Within(10));
  EXPECT_FALSE(r.started);
  EXPECT_NE(r.Describe().find("could not start"), std::string::npos) << r.Describe();
}

TEST(RunCommand, CapsWhatItKeepsOfAFloodAndStillReadsItAll) {
  CommandOptions options = Within(20);
  options.max_output_bytes = 1000;
  const CommandResult r = RunCommand({"sh", "-c", "head -c 5000000 /dev/zero; echo done >&2"}, options);
  EXPECT_TRUE(r.ok()) << r.Describe();  // not blocked on a full pipe
  EXPECT_EQ(r.out.size(), 1000u);
  EXPECT_EQ(r.err, "done\n");
}

TEST(RunCommand, KillsTheWholeGroupAtTheDeadline) {
  const Clock::time_point start = Clock::now();
  // The child's own child keeps the pipe open: the deadline must end both.
  const CommandResult r = RunCommand({"sh", "-c", "sleep 30 & sleep 30"}, Within(0.5));
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_NE(r.Describe().find("timed out"), std::string::npos);
}

}  // namespace
}  // namespace trainyard
