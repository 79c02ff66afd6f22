// Crash-safe file replacement: bytes go to "<path>.tmp-<pid>", a file this writer
// creates (O_EXCL, O_NOFOLLOW), which is fsynced and renamed over <path>, and the folder
// is fsynced. A reader sees the old file or the whole new one, never a torn write; a
// symlink at <path> is replaced, never followed.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace trainyard {

class AtomicFileWriter {
 public:
  // Throws std::runtime_error if the temporary file cannot be created.
  explicit AtomicFileWriter(std::string path);
  // Removes the temporary file unless Commit() succeeded.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void Write(const void* data, size_t size);
  void Write(const std::string& bytes) { Write(bytes.data(), bytes.size()); }
  // fsync, rename over the target, fsync the folder. Throws on any failure.
  void Commit();

 private:
  std::string path_, temp_path_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// Writes `bytes` to `path` atomically.
void WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace trainyard
