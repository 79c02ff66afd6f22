// Readers of bytes someone else chose: linear-time module patterns (common/module_pattern.h),
// depth-bounded JSON (common/bounded_json.h), files read without blocking or following
// links (common/regular_file.h), URL query strings (common/query_string.h); and the rate limit on what peers can make
// us log (common/log_limiter.h).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/atomic_file.h"
#include "common/bounded_json.h"
#include "common/log_limiter.h"
#include "common/module_pattern.h"
#include "common/query_string.h"
#include "common/regular_file.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

TEST(ModulePattern, MatchesWholeNamesAsPeftsFullmatchDoes) {
  std::string error;
  auto pattern = ModulePattern::Compile(R"(.*\.(query|value))", &error);
  ASSERT_TRUE(pattern) << error;
  EXPECT_TRUE(pattern->FullMatch("bert.encoder.layer.0.attention.self.query"));
  EXPECT_FALSE(pattern->FullMatch("bert.encoder.layer.0.attention.self.query.lora"));
  EXPECT_FALSE(pattern->FullMatch("bert.encoder.layer.0.attention.self.key"));
}

// A pattern that backtracks exponentially in std::regex, on a long name, answers (RE2 is
// linear); a pattern nested 100,000 deep is refused, not compiled recursively.
TEST(ModulePattern, HostilePatternsEndQuickly) {
  std::string error;
  auto pattern = ModulePattern::Compile("(.*)*(.*)*(.*)*z", &error);
  ASSERT_TRUE(pattern) << error;
  EXPECT_FALSE(pattern->FullMatch(std::string(100000, 'a')));
  EXPECT_FALSE(ModulePattern::Compile(std::string(100000, '(') + "a" + std::string(100000, ')'), &error));
  EXPECT_NE(error.find("longer than 4096 bytes"), std::string::npos) << error;
  EXPECT_FALSE(ModulePattern::Compile("(?=query)", &error));  // lookahead: Python has it, RE2 does not
  EXPECT_NE(error.find("invalid perl operator"), std::string::npos) << error;
}

TEST(BoundedJson, RefusesNestingPastTheLimitAndKeepsTheRest) {
  EXPECT_EQ(ParseBoundedJson(R"({"a": [[1, 2], {"b": null}]})")["a"][0][1], 2);
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_THROW(ParseBoundedJson(deep), JsonTooDeep);
  EXPECT_TRUE(ParseBoundedJsonOrDiscarded(deep).is_discarded());
  const std::string at_limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(ParseBoundedJson(at_limit));
  EXPECT_THROW(ParseBoundedJson("[" + at_limit + "]"), JsonTooDeep);
  EXPECT_THROW(ParseBoundedJson("{\"a\": "), nlohmann::json::exception);
  EXPECT_TRUE(ParseBoundedJsonOrDiscarded("{\"a\": ").is_discarded());
}

// A flood of refusals is written as `burst` lines a window; the first line after it says
// how many were left out. Kinds are counted apart.
TEST(QueryString, DecodesNamesAndValuesAfterTheFirstQuestionMark) {
  using Fields = std::map<std::string, std::string>;
  EXPECT_EQ(ParseQueryString("/api/jobs"), Fields{});
  EXPECT_EQ(ParseQueryString("/api/jobs?"), Fields{});
  EXPECT_EQ(ParseQueryString("/api/jobs?limit=5&user=a%2Fb+c&&flag&x=?y=1"),
            (Fields{{"limit", "5"}, {"user", "a/b c"}, {"flag", ""}, {"x", "?y=1"}}));
  EXPECT_EQ(ParseQueryString("/?a%3Db=%41%7e"), (Fields{{"a=b", "A~"}}));
}

TEST(QueryString, RefusesBadEscapesRepeatsAndTooManyFieldsNamingTheField) {
  const auto why = [](const std::string& target) {
    try {
      ParseQueryString(target);
    } catch (const QueryError& e) {
      return std::string(e.what());
    }
    return std::string("parsed");
  };
  EXPECT_EQ(why("/?user=a%2"), "'a%2' has a '%' not followed by two hexadecimal digits");
  EXPECT_EQ(why("/?user=%zz"), "'%zz' has a '%' not followed by two hexadecimal digits");
  EXPECT_EQ(why("/?limit=1&limit=2"), "'limit' is given twice in the query");
  std::string many = "/?";
  for (size_t i = 0; i <= kMaxQueryFields; ++i) many += "f" + std::to_string(i) + "=1&";
  EXPECT_EQ(why(many), "the query has more than 32 fields");
  // An echoed field is cut, so an 8 KB one does not come back whole in the error.
  EXPECT_LT(why("/?v=" + std::string(8192, 'a') + "%").size(), 200u);
}

TEST(LogLimiter, WritesABurstPerWindowAndCountsTheRest) {
  LogLimiter limiter(3, 10.0);
  int64_t left_out = -1;
  int written = 0;
  for (int i = 0; i < 1000; ++i) written += limiter.Allow("refused", 100.0 + i * 0.001, &left_out);
  EXPECT_EQ(written, 3);
  EXPECT_TRUE(limiter.Allow("zap", 100.5, &left_out));
  EXPECT_EQ(left_out, 0);
  ASSERT_TRUE(limiter.Allow("refused", 110.0, &left_out));
  EXPECT_EQ(left_out, 997);
  EXPECT_EQ(LeftOutNote(left_out), " (997 more like it not logged)");
  ASSERT_TRUE(limiter.Allow("refused", 110.1, &left_out));
  EXPECT_EQ(left_out, 0);
  EXPECT_EQ(LeftOutNote(0), "");
}

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("ty_regular_file_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "job");
    std::ofstream(root_ / "job" / "ok.json") << "{}";
    std::ofstream(root_ / "outside.txt") << "secret";
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(RegularFileTest, ReadsARegularFileBeneathTheRoot) {
  const FileRead read = ReadFileBeneath(root_.string(), "job/ok.json", 64);
  ASSERT_TRUE(read.ok()) << read.why;
  EXPECT_EQ(read.bytes, "{}");
  EXPECT_EQ(ReadFileBeneath(root_.string(), "job/none.json", 64).status, FileRead::kMissing);
  EXPECT_EQ(ReadFileBeneath(root_.string(), "job/ok.json", 1).status, FileRead::kTooLarge);
}

// A FIFO would block open() and read() for ever; /dev/zero never ends; a link leads
// anywhere. Each is refused at once.
TEST_F(RegularFileTest, FifosDevicesAndLinksAreRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((root_ / "job" / "fifo.svg").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", root_ / "job" / "zero.json");
  fs::create_symlink(root_ / "outside.txt", root_ / "job" / "link.txt");
  fs::create_directory_symlink(root_, root_ / "job" / "loop");
  for (const char* name : {"job/fifo.svg", "job/zero.json", "job/link.txt", "job/loop/outside.txt", "job"}) {
    const FileRead read = ReadFileBeneath(root_.string(), name, 1 << 20);
    EXPECT_EQ(read.status, FileRead::kRefused) << name << ": " << read.why;
  }
  for (const char* name : {"../outside.txt", "job/../outside.txt", "job//ok.json", "./job/ok.json"})
    EXPECT_EQ(ReadFileBeneath(root_.string(), name, 1 << 20).status, FileRead::kRefused) << name;
  EXPECT_EQ(ReadUserFile((root_ / "job" / "fifo.svg").string(), 1 << 20).status, FileRead::kRefused);
  EXPECT_EQ(ReadUserFile("/dev/zero", 1 << 20).status, FileRead::kRefused);
  EXPECT_TRUE(ReadUserFile((root_ / "job" / "link.txt").string(), 64).ok());  // a user's own link is followed
}

// A job's files as the coordinator and agents list them (Note [Artifacts]): regular files
// only, no link followed, within the bounds, by path.
TEST_F(RegularFileTest, ListingsHoldRegularFilesOnlyNeverFollowALinkAndAreBounded) {
  fs::create_directories(root_ / "job" / "model" / "deep" / "er");
  std::ofstream(root_ / "job" / "model" / "w.bin") << "12345";
  std::ofstream(root_ / "job" / "model" / "deep" / "er" / "x") << "x";
  ASSERT_EQ(::mkfifo((root_ / "job" / "fifo").c_str(), 0600), 0);
  fs::create_symlink(root_ / "outside.txt", root_ / "job" / "link.txt");
  fs::create_directory_symlink(root_, root_ / "job" / "loop");
  bool truncated = true;
  std::vector<std::string> paths;
  for (const FileEntry& f : ListFilesBeneath(root_.string(), "job", 100, 16, &truncated)) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"model/deep/er/x", "model/w.bin", "ok.json"}));
  EXPECT_FALSE(truncated);
  const auto shallow = ListFilesBeneath(root_.string(), "job", 100, 2, &truncated);
  EXPECT_EQ(shallow.size(), 2u);  // model/deep/er is three folders down
  EXPECT_EQ(shallow.front().path, "model/w.bin");
  EXPECT_EQ(shallow.front().size, 5);
  EXPECT_EQ(ListFilesBeneath(root_.string(), "job", 1, 16, &truncated).size(), 1u);
  EXPECT_TRUE(truncated);
  EXPECT_TRUE(ListFilesBeneath(root_.string(), "none", 100, 16, &truncated).empty());
  EXPECT_THROW(ListFilesBeneath(root_.string(), "job/loop", 100, 16, &truncated), std::runtime_error);
  EXPECT_THROW(ListFilesBeneath(root_.string(), "../job", 100, 16, &truncated), std::runtime_error);
}

TEST_F(RegularFileTest, FoldersAreMadeBeneathTheRootAndNeverThroughALink) {
  MakeFoldersBeneath(root_.string(), "7/attempt-1");
  EXPECT_TRUE(fs::is_directory(root_ / "7" / "attempt-1"));
  fs::create_directories(root_ / "elsewhere");
  fs::create_directory_symlink(root_ / "elsewhere", root_ / "7" / "attempt-2");
  EXPECT_THROW(MakeFoldersBeneath(root_.string(), "7/attempt-2"), std::runtime_error);
  EXPECT_THROW(MakeFoldersBeneath(root_.string(), "7/attempt-2/x"), std::runtime_error);
  EXPECT_FALSE(fs::exists(root_ / "elsewhere" / "x"));
  EXPECT_THROW(MakeFoldersBeneath(root_.string(), "../escape"), std::runtime_error);
}

// The temporary file is created fresh: a FIFO planted under its name is replaced, not
// opened (which would block), and a symlink at the target is replaced, not followed.
TEST_F(RegularFileTest, AtomicWritesNeitherBlockOnPlantedFifosNorFollowLinks) {
  const fs::path target = root_ / "job" / "epochs.csv";
  ASSERT_EQ(::mkfifo((target.string() + ".tmp-" + std::to_string(::getpid())).c_str(), 0600), 0);
  fs::create_symlink(root_ / "outside.txt", target);
  WriteFileAtomically(target.string(), "epoch\n1\n");
  EXPECT_FALSE(fs::is_symlink(target));
  EXPECT_EQ(ReadUserFile(target.string(), 64).bytes, "epoch\n1\n");
  EXPECT_EQ(ReadUserFile((root_ / "outside.txt").string(), 64).bytes, "secret");
}

}  // namespace
}  // namespace trainyard
