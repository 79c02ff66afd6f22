#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace trainyard {
namespace {

namespace fs = std::filesystem;

// Each test's files live in a folder of its own, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ty_safetensors_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path Path(const std::string& name) { return dir_ / name; }

 private:
  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripKeepsBytesShapesAndMetadata) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {7, -8};
  const std::string path = Path("rt.safetensors").string();
  WriteSafetensors(path, {{"a", "F32", {2, 3}, a.data()}, {"b", "I64", {2}, b.data()}}, {{"k", "v"}});
  SafetensorsFile file = SafetensorsFile::Read(path);
  ASSERT_EQ(file.tensors().size(), 2u);
  const TensorRecord& ra = file.tensors().at("a");
  EXPECT_EQ(ra.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(file.Data(ra), a.data(), 24), 0);
  EXPECT_EQ(file.metadata().at("k"), "v");
}

TEST_F(SafetensorsTest, TruncatedFileIsRejected) {
  std::vector<float> a(100, 1.0f);
  const std::string path = Path("trunc.safetensors").string();
  WriteSafetensors(path, {{"a", "F32", {100}, a.data()}}, {});
  fs::resize_file(path, fs::file_size(path) - 10);
  try {
    SafetensorsFile::Read(path);
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, HeaderThatLiesAboutSizesIsRejected) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,16]}})";
  const std::string path = Path("lie.safetensors").string();
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(16, '\0');
  out.close();
  try {
    SafetensorsFile::Read(path);
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("needs 64 bytes but data_offsets span 16"), std::string::npos) << e.what();
  }
}

// A safetensors image: the 8-byte little-endian size, `header`, then `data_bytes` zeros.
std::vector<uint8_t> Image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>((uint64_t(header.size()) >> (8 * i)) & 0xFF);
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_bytes, 0);
  return bytes;
}

// The SafetensorsError message for parsing `bytes`, or "" if they parsed.
std::string ParseError(const std::string& header, size_t data_bytes) {
  try {
    SafetensorsFile::Parse(Image(header, data_bytes), "t.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsParseTest, ValidImageParsesFromMemory) {
  EXPECT_EQ(ParseError(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})", 4), "");
}

TEST(SafetensorsParseTest, HeaderWithANumberBeyondDoubleIsRejected) {
  // nlohmann::json throws out_of_range, not parse_error, for it (found by fuzz_safetensors).
  const std::string error = ParseError(R"({"a":{"dtype":"U8","shape":[1e999],"data_offsets":[0,1]}})", 1);
  EXPECT_NE(error.find("header is not JSON"), std::string::npos) << error;
}

TEST(SafetensorsParseTest, ShapeWhoseByteCountOverflowsIsRejected) {
  // 2^62 x 4 elements x 4 bytes wraps to 0 in 64 bits: it must not pass as an empty tensor.
  const std::string error =
      ParseError(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(error.find("is too large"), std::string::npos) << error;
}

TEST(SafetensorsParseTest, NonIntegerShapesAndOffsetsAreRejected) {
  for (const char* header : {R"({"a":{"dtype":"U8","shape":[1e300],"data_offsets":[0,1]}})",
                             R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})",
                             R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})",
                             R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0.0,1]}})",
                             R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})"}) {
    EXPECT_NE(ParseError(header, 1), "") << header;
  }
}

TEST(SafetensorsParseTest, OverlappingOrGappedTensorsAreRejected) {
  const std::string overlap = ParseError(
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
      3);
  EXPECT_NE(overlap.find("overlaps at byte 1"), std::string::npos) << overlap;
  const std::string gap = ParseError(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3);
  EXPECT_NE(gap.find("leaves a gap at byte 0"), std::string::npos) << gap;
}

TEST(SafetensorsParseTest, MetadataMustMapStringsToStrings) {
  EXPECT_NE(ParseError(R"({"__metadata__":[1,2]})", 0).find("__metadata__ must be an object"), std::string::npos);
  EXPECT_NE(ParseError(R"({"__metadata__":{"k":1}})", 0).find("'k' is not a string"), std::string::npos);
}

TEST_F(SafetensorsTest, FlippedBitsInTheDataFailTheChecksum) {
  std::vector<float> a(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f;
  const std::string path = Path("crc.safetensors").string();
  WriteSafetensors(path, {{"a", "F32", {1000}, a.data()}}, {{"k", "v"}});
  SafetensorsFile clean = SafetensorsFile::Read(path);
  EXPECT_TRUE(clean.checksummed());
  EXPECT_EQ(clean.metadata().at(kDataChecksumKey).size(), 8u);
  // One bit near the end of the data, then 2,000 bits spread over it, as the tester did.
  for (int flips : {1, 2000}) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(path));
    for (int i = 0; i < flips; ++i) {
      const std::streamoff at = size - 1 - (static_cast<std::streamoff>(i) * 1993) % 4000;
      f.seekg(at);
      char byte = 0;
      f.get(byte);
      f.seekp(at);
      f.put(static_cast<char>(byte ^ (1 << (i % 8))));
    }
    f.close();
    try {
      SafetensorsFile::Read(path);
      ADD_FAILURE() << flips << " flipped bits went unnoticed";
    } catch (const SafetensorsError& e) {
      EXPECT_NE(std::string(e.what()).find("do not match their checksum"), std::string::npos) << e.what();
    }
    WriteSafetensors(path, {{"a", "F32", {1000}, a.data()}}, {{"k", "v"}});
  }
}

TEST_F(SafetensorsTest, FileWithoutChecksumReadsAndMalformedChecksumIsRejected) {
  auto write_raw = [&](const std::string& header, const std::string& name) {
    const std::string path = Path(name).string();
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(4, '\0');
    return path;
  };
  const std::string plain = write_raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "plain.safetensors");
  EXPECT_FALSE(SafetensorsFile::Read(plain).checksummed());
  const std::string bad =
      write_raw(R"({"__metadata__":{"data_crc32c":"xyz"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                "bad.safetensors");
  try {
    SafetensorsFile::Read(bad);
    ADD_FAILURE();
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("is not 8 lowercase hex digits"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, ShapeWhoseByteCountWrapsIsRejected) {
  // 2^32 x 2^32 F32 "needs" 2^66 bytes, which wrapped to 0 and matched an empty span.
  std::vector<uint8_t> bytes(8, 0);
  const std::string header = R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  bytes[0] = static_cast<uint8_t>(header.size());
  bytes.insert(bytes.end(), header.begin(), header.end());
  try {
    SafetensorsFile::Parse(bytes, "wrap.safetensors");
    ADD_FAILURE();
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("is too large"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trainyard
