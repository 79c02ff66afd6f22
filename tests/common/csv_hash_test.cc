// The CSV row splitter and the FNV-1a and CRC32C checksums.
#include <gtest/gtest.h>

#include <string>

#include "common/csv.h"
#include "common/hash.h"

namespace trainyard {
namespace {

TEST(SplitCsv, KeepsEmptyCells) {
  EXPECT_EQ(SplitCsv("a,,b,"), (std::vector<std::string>{"a", "", "b", ""}));
  EXPECT_EQ(SplitCsv("1.5"), (std::vector<std::string>{"1.5"}));
  EXPECT_TRUE(SplitCsv("").empty());
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
