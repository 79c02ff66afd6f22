// A fresh folder for one test under the system's temporary folder, named by the test and
// the process (so suites running at once never share one), emptied when made and removed
// when it goes.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace trainyard {

class ScratchDir {
 public:
  explicit ScratchDir(std::string_view name)
      : path_(std::filesystem::temp_directory_path() / (std::string(name) + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace trainyard
