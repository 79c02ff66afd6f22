// The order in which a torch binary loads its shared libraries (see ty_torch in the
// top-level CMakeLists.txt): a c10 error, out of memory included, must stay an
// exception that callers can catch, and libtorch's std::filesystem must be the
// system's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "data/sentencepiece_tokenizer.h"

namespace trainyard {
namespace {

TEST(LinkOrder, AFailedAllocationThrowsInsteadOfAborting) {
  // Uses libsentencepiece, so this binary loads it as the worker does.
  EXPECT_THROW(SentencePieceTokenizer("/nonexistent.model"), std::runtime_error);
  EXPECT_THROW(torch::empty({int64_t(1) << 60}, torch::kFloat), c10::Error);
}

TEST(LinkOrder, FilesystemCallsFromLibtorchUseTheSystemLibrary) {
  const auto dir = std::filesystem::temp_directory_path() / ("ty_link_order_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "a" / "b");
  std::ofstream(dir / "a" / "b" / "file") << "x";
  EXPECT_EQ(std::filesystem::remove_all(dir), 4u);
}

}  // namespace
}  // namespace trainyard
