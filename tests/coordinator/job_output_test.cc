// An attempt's output.log as the coordinator keeps it (coordinator/job_output.h):
// resends dropped, gaps named, rotation, reads by offset and rank, and no symlink
// followed.
#include "coordinator/job_output.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class OutputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runs_ = fs::temp_directory_path() / ("ty_output_" + std::to_string(::getpid()));
    fs::create_directories(runs_ / "7" / "attempt-1");
  }
  void TearDown() override { fs::remove_all(runs_); }
  std::string Contents(const std::string& name) const {
    std::ifstream in(runs_ / "7" / "attempt-1" / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  fs::path runs_;
};

TEST_F(OutputFilesTest, ResendsAreDroppedAndAGapIsNamedInTheFile) {
  OutputFiles files(runs_.string(), 1 << 20);
  EXPECT_EQ(files.Append(7, 1, 0, "[rank 0] a\n[rank 1] b\n"), 22);
  EXPECT_EQ(files.Append(7, 1, 0, "[rank 0] a\n[rank 1] b\n"), 22);  // a resend
  EXPECT_EQ(files.Append(7, 1, 11, "[rank 1] b\nc\n"), 24);          // half a resend
  EXPECT_EQ(files.Append(7, 1, 30, "d\n"), 32);                      // 6 bytes the agent dropped
  EXPECT_EQ(Contents("output.log"),
            "[rank 0] a\n[rank 1] b\nc\n[trainyard: 6 bytes of this attempt's output were dropped by its agent "
            "while the coordinator was unreachable]\nd\n");
  // A coordinator that restarted takes the first chunk it hears at its word.
  OutputFiles restarted(runs_.string(), 1 << 20);
  EXPECT_EQ(restarted.Append(7, 1, 32, "e\n"), 34);
  EXPECT_EQ(Contents("output.log").substr(Contents("output.log").size() - 4), "d\ne\n");
}

TEST_F(OutputFilesTest, ReadsWholeLinesByOffsetAndRankAndTheTail) {
  OutputFiles files(runs_.string(), 1 << 20);
  const std::string text = "[rank 0] zero\n[rank 1] one\nmpirun's own\n[rank 10] ten\n";
  files.Append(7, 1, 0, text);
  OutputRead all = files.Read(7, 1, 0, 1 << 20, -1);
  EXPECT_EQ(all.text, text);
  EXPECT_EQ(all.next_offset, int64_t(text.size()));
  EXPECT_FALSE(all.restarted);
  EXPECT_EQ(files.Read(7, 1, 0, 1 << 20, 1).text, "[rank 1] one\nmpirun's own\n");
  EXPECT_EQ(files.Read(7, 1, 0, 1 << 20, 10).text, "mpirun's own\n[rank 10] ten\n");
  // A read that cannot hold the next whole line ends before it.
  const OutputRead part = files.Read(7, 1, 0, 20, -1);
  EXPECT_EQ(part.text, "[rank 0] zero\n");
  EXPECT_EQ(part.next_offset, 14);
  EXPECT_EQ(files.Read(7, 1, part.next_offset, 1 << 20, -1).text, text.substr(14));
  EXPECT_EQ(files.Read(7, 1, int64_t(text.size()), 1 << 20, -1).text, "");
  EXPECT_EQ(files.Tail(7, 1, 30), "mpirun's own\n[rank 10] ten\n");  // no line cut at its start
  EXPECT_EQ(files.Read(7, 2, 0, 1 << 20, -1).text, "");              // no output (yet)
  EXPECT_EQ(files.Tail(7, 2, 30), "");
}

TEST_F(OutputFilesTest, RotatesPastItsCapAndAReaderPastTheEndStartsOver) {
  OutputFiles files(runs_.string(), 45);
  const std::string forty(39, 'a');
  files.Append(7, 1, 0, forty + "\n");
  files.Append(7, 1, 40, "second\n");
  EXPECT_EQ(Contents("output.log.1"), forty + "\n");
  EXPECT_EQ(Contents("output.log"), "second\n");
  const OutputRead read = files.Read(7, 1, 40, 1 << 20, -1);  // past the new file's end
  EXPECT_TRUE(read.restarted);
  EXPECT_EQ(read.text, "second\n");
  EXPECT_EQ(read.next_offset, 7);
}

TEST_F(OutputFilesTest, ASymlinkOrAFifoInTheWayIsNeverFollowedOrBlockedOn) {
  const fs::path outside = runs_ / "outside.txt";
  std::ofstream(outside) << "secret\n";
  fs::create_symlink(outside, runs_ / "7" / "attempt-1" / "output.log");
  OutputFiles files(runs_.string(), 1 << 20);
  EXPECT_THROW(files.Append(7, 1, 0, "x\n"), std::runtime_error);
  EXPECT_THROW(files.Read(7, 1, 0, 1 << 20, -1), std::runtime_error);
  std::ifstream in(outside);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "secret");
  fs::remove(runs_ / "7" / "attempt-1" / "output.log");
  ASSERT_EQ(::mkfifo((runs_ / "7" / "attempt-1" / "output.log").c_str(), 0600), 0);
  EXPECT_THROW(files.Append(7, 1, 0, "x\n"), std::runtime_error);
  EXPECT_THROW(files.Read(7, 1, 0, 1 << 20, -1), std::runtime_error);
}

TEST(LinesOfRank, KeepsTheRanksLinesAndTheUnrankedOnes) {
  EXPECT_EQ(LinesOfRank("[rank 1] a\n[rank 12] b\nc\n[rank 1]d\n", 1), "[rank 1] a\nc\n");
  EXPECT_EQ(LinesOfRank("", 0), "");
}

}  // namespace
}  // namespace trainyard
