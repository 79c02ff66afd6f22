// The CSV row splitter, the epoch table drawn from CSV rows, and the FNV-1a and CRC32C
// checksums.
#include <gtest/gtest.h>

#include <string>

#include "common/csv.h"
#include "common/epoch_table.h"
#include "common/hash.h"

namespace trainyard {
namespace {

TEST(SplitCsv, KeepsEmptyCells) {
  EXPECT_EQ(SplitCsv("a,,b,"), (std::vector<std::string>{"a", "", "b", ""}));
  EXPECT_EQ(SplitCsv("1.5"), (std::vector<std::string>{"1.5"}));
  EXPECT_TRUE(SplitCsv("").empty());
}

// The epoch table `jobctl logs` and the worker print, from epochs.csv's columns in any
// order; what a row lacks shows "-".
TEST(EpochTable, DrawsARowFromCsvColumnsByName) {
  const std::vector<std::string> header = {
      "epoch",         "time_s",     "steps",     "ms_per_step",  "samples_per_s",
      "data_wait_pct", "train_loss", "eval_loss", "eval_acc",     "lr",
      "loss_scale",    "comm_ms",    "ranks",     "slowest_rank", "slowest_ms_per_step"};
  const std::string row = EpochTableRow(header, SplitCsv("2,12.345,40,25.000,1024.56,3.21,0.123456,0.2,0.9,5.0e-04,,"
                                                         "5.000,2,1,26.04"));
  std::vector<std::string> fields;
  for (size_t at = 0; at < row.size();) {
    const size_t begin = row.find_first_not_of(' ', at);
    if (begin == std::string::npos) break;
    const size_t end = row.find(' ', begin);
    fields.push_back(row.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    at = end == std::string::npos ? row.size() : end;
  }
  EXPECT_EQ(fields, (std::vector<std::string>{"2", "12.3", "40", "25.0", "1024.6", "3.2", "0.1235", "0.2000", "0.9000",
                                              "5.00e-04", "-", "20.0", "r1", "26.0ms", "-"}));
  EXPECT_EQ(EpochTableHeader().substr(0, 5), "epoch");
  std::vector<std::string> with_host = header;
  with_host.push_back("slowest_host");
  const std::string named = EpochTableRow(with_host, SplitCsv("2,1,40,25,1,1,0.1,0.2,0.9,5e-04,,5,2,1,26.04,h2"));
  EXPECT_NE(named.find(" h2:1 26.0ms"), std::string::npos) << named;
  EXPECT_EQ(EpochTableRow({"epoch"}, {"7"}).substr(0, 1), "7");
}

TEST(EpochTable, ShowsAnElasticRunsQuorumSizesAndTheirChanges) {
  const std::vector<std::string> header = {"epoch", "replicas_min", "replicas_max", "replica_changes"};
  const std::string steady = EpochTableRow(header, {"1", "3", "3", "0"});
  EXPECT_EQ(steady.substr(steady.size() - 2), " 3") << steady;
  EXPECT_EQ(steady.find("change"), std::string::npos) << steady;
  EXPECT_NE(EpochTableRow(header, {"1", "2", "3", "2"}).find(" 2-3, 2 changes"), std::string::npos);
  EXPECT_NE(EpochTableRow(header, {"1", "2", "3", "1"}).find(" 2-3, 1 change"), std::string::npos);
  const std::string plain = EpochTableRow(header, {"1", "", "", ""});
  EXPECT_EQ(plain.substr(plain.size() - 2), " -") << "not an elastic run";
  EXPECT_NE(EpochTableHeader().find(" replicas"), std::string::npos);
}

TEST(Fnv1a, MatchesTheReferenceVectorsAndChains) {
  // Published FNV-1a 64-bit test vectors.
  EXPECT_EQ(Fnv1a("", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a("foobar", 6), 0x85944171f73967e8ULL);
  // Hashing in pieces equals hashing at once.
  EXPECT_EQ(Fnv1a("bar", 3, Fnv1a("foo", 3)), Fnv1a("foobar", 6));
}

TEST(Crc32c, MatchesTheReferenceVectorsAndChains) {
  // RFC 3720 (iSCSI), appendix B.4, and the common "123456789" check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  const std::string text = "a longer text that spans several eight-byte blocks";
  EXPECT_EQ(Crc32c(text.data() + 13, text.size() - 13, Crc32c(text.data(), 13)), Crc32c(text.data(), text.size()));
}

}  // namespace
}  // namespace trainyard
