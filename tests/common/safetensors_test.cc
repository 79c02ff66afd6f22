#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace trainyard {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  fs::path Path(const std::string& name) {
    return fs::temp_directory_path() / (std::to_string(::getpid()) + "_" + name);
  }
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

}  // namespace
}  // namespace trainyard
