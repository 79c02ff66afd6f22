// A job's output as plain lines (worker/pool/output_lines.h): mpirun's tags split
// anywhere, progress lines kept as their last state, escape sequences and bad UTF-8
// gone. The last test runs a real mpirun of two ranks through JobProcess.
#include "worker/pool/output_lines.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/pool/job_process.h"

namespace trainyard {
namespace {

std::vector<std::string> Rendered(const std::vector<OutputLine>& lines) {
  std::vector<std::string> out;
  for (const OutputLine& line : lines) out.push_back(RenderedLine(line));
  return out;
}

// Feeds `chunks` one by one, then finishes.
std::vector<std::string> Lines(bool tagged, const std::vector<std::string>& chunks) {
  OutputLines splitter(tagged);
  std::vector<OutputLine> lines;
  for (const std::string& chunk : chunks) splitter.Feed(chunk, &lines);
  splitter.Finish(&lines);
  return Rendered(lines);
}

TEST(OutputLines, UntaggedLinesArePlainTextWithTheirProgressAsItsLastState) {
  EXPECT_EQ(Lines(false, {"epoch 1\n", "\x1b[32mok\x1b[0m\n", "a\rb\r", "c\n", "done\r\n"}),
            (std::vector<std::string>{"epoch 1", "ok", "c", "done"}));
  // A progress bar that clears its line ("\r\x1b[K") keeps the state it showed last, and
  // one the job never ended comes out at the end.
  EXPECT_EQ(Lines(false, {"\r\x1b[K10%", "\r\x1b[K100%", "\r\x1b[K\n", "50%\r60%"}),
            (std::vector<std::string>{"100%", "60%"}));
  EXPECT_EQ(Lines(false, {"\n", "tab\tkept\x07\x08\n"}), (std::vector<std::string>{"", "tab\tkept"}));
}

TEST(OutputLines, TagsCutAnywhereKeepEachRanksTextApart) {
  // mpirun's fragments of two ranks, the second rank's tag cut across two reads, and a
  // rank's partial line interrupted by another rank.
  EXPECT_EQ(Lines(true, {"[1,0]<stdout>:par", "[1,1]<std", "err>:x\n[1,0]<stdout>:tial\n", "mpirun: done\n"}),
            (std::vector<std::string>{"[rank 1] x", "[rank 0] partial", "mpirun: done"}));
  // A rank's stdout and stderr are put together apart.
  EXPECT_EQ(Lines(true, {"[1,1]<stdout>:step 3/3[1,1]<stderr>:warning\n[1,1]<stdout>:\n"}),
            (std::vector<std::string>{"[rank 1] warning", "[rank 1] step 3/3"}));
  // Progress of two ranks, interleaved by carriage returns.
  EXPECT_EQ(Lines(true, {"[1,0]<stdout>:1/3\r[1,1]<stdout>:1/3\r[1,0]<stdout>:3/3\n[1,1]<stdout>:2/3\n"}),
            (std::vector<std::string>{"[rank 0] 3/3", "[rank 1] 2/3"}));
  // What only looks like a tag is text.
  EXPECT_EQ(Lines(true, {"[1,x]<stdout>:a\n", "[12]\n", "[1,2]<stdin>:b\n"}),
            (std::vector<std::string>{"[1,x]<stdout>:a", "[12]", "[1,2]<stdin>:b"}));
  // A tag the output ended in the middle of is text too.
  EXPECT_EQ(Lines(true, {"[1,0]<stdout>:a\n[1,0]<st"}), (std::vector<std::string>{"[rank 0] a", "[1,0]<st"}));
}

TEST(OutputLines, EscapesControlsAndBadUtf8AreRemovedOrReplaced) {
  EXPECT_EQ(PlainText("\x1b[1;31mred\x1b[0m \x1b]0;title\x07plain \x1b(Bx \x1b]8;;u\x1b\\link"), "red plain x link");
  EXPECT_EQ(PlainText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82");
  const std::string replacement = "\xef\xbf\xbd";
  EXPECT_EQ(PlainText("a\xff"
                      "b\xc3"),
            "a" + replacement + "b" + replacement);
  EXPECT_EQ(PlainText("\xed\xa0\x80"), replacement + replacement + replacement);  // a UTF-16 surrogate
  EXPECT_EQ(PlainText("\xe2\x82"), replacement + replacement);                    // cut short
  EXPECT_EQ(PlainText("\x1b[31"), "");                                            // cut short
}

TEST(OutputLines, AnEndlessLineIsCutAndManyFakeRanksShareOneBuffer) {
  OutputLines splitter(true);
  std::vector<OutputLine> lines;
  splitter.Feed(std::string(3 * OutputLines::kMaxLineBytes + 10, 'x'), &lines);
  ASSERT_EQ(lines.size(), 3u);
  for (const OutputLine& line : lines) EXPECT_EQ(line.text.size(), OutputLines::kMaxLineBytes);
  OutputLines fake_ranks(true);
  lines.clear();
  std::string fakes;
  for (int rank = 0; rank < 3000; ++rank) fakes += "[1," + std::to_string(rank) + "]<stdout>:y";
  fake_ranks.Feed(fakes + "\n", &lines);
  fake_ranks.Finish(&lines);
  size_t untagged = 0;
  for (const OutputLine& line : lines) untagged += line.rank < 0 ? 1 : 0;
  EXPECT_EQ(lines.size(), OutputLines::kMaxSources + 1);  // a line of each of the first ranks, one of the rest
  EXPECT_EQ(untagged, 1u);
}

// A real mpirun of two ranks: each writes a coloured line, a progress line rewritten in
// place and a line to stderr; every line comes once, prefixed with its rank, plain.
TEST(OutputLines, TwoRanksOfARealMpirunComeAsPrefixedPlainLines) {
  const std::string script = ::testing::TempDir() + "/two_ranks_" + std::to_string(::getpid()) + ".sh";
  std::ofstream(script) << "#!/bin/sh\n"
                           "r=$OMPI_COMM_WORLD_RANK\n"
                           "printf '\\033[1;32mrank %s says hello\\033[0m\\n' $r\n"
                           "for i in 1 2 3; do printf '\\rstep %s/3' $i; sleep 0.05; done; printf '\\n'\n"
                           "echo \"to stderr from $r\" >&2\n";
  ASSERT_EQ(::chmod(script.c_str(), 0755), 0);
  JobLaunch launch;
  launch.worker = script;
  launch.hosts = {"localhost", "localhost"};
  launch.slots = {0, 1};
  launch.relay = "unused";
  launch.allow_run_as_root = ::geteuid() == 0;
  std::mutex mutex;
  std::vector<std::string> lines;
  {
    JobProcess job(launch, [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!job.Exited() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(job.Exited());
    EXPECT_TRUE(job.Succeeded()) << job.ExitText();
  }
  for (const std::string rank : {"0", "1"})
    for (const std::string& text :
         {"rank " + rank + " says hello", std::string("step 3/3"), "to stderr from " + rank}) {
      const std::string line = "[rank " + rank + "] " + text;
      EXPECT_EQ(std::count(lines.begin(), lines.end(), line), 1) << line;
    }
  for (const std::string& line : lines) EXPECT_EQ(line.find_first_of("\x1b\r"), std::string::npos) << line;
  std::remove(script.c_str());
}

}  // namespace
}  // namespace trainyard
