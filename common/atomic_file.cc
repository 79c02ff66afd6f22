#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace trainyard {
namespace {

[[noreturn]] void Throw(const std::string& what, const std::string& path) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

void SyncFolder(const std::string& path) {
  std::string folder = std::filesystem::path(path).parent_path().string();
  int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp-" + std::to_string(::getpid())) {
  // A new file, never one found there: a FIFO or symlink planted under the temporary
  // name would block the open or redirect the write. What is there is an earlier
  // process's leftover (the name holds our pid), removed once.
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(temp_path_.c_str(), kFlags, 0644);
  if (fd < 0 && errno == EEXIST && ::unlink(temp_path_.c_str()) == 0) fd = ::open(temp_path_.c_str(), kFlags, 0644);
  if (fd < 0) Throw("cannot create", temp_path_);
  file_ = ::fdopen(fd, "wb");
  if (!file_) {
    ::close(fd);
    Throw("cannot create", temp_path_);
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_) std::fclose(file_);
  if (!committed_) std::remove(temp_path_.c_str());
}

void AtomicFileWriter::Write(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) Throw("write failed", temp_path_);
}

void AtomicFileWriter::Commit() {
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) Throw("flush failed", temp_path_);
  std::fclose(file_);
  file_ = nullptr;
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) Throw("rename failed", path_);
  committed_ = true;
  SyncFolder(path_);
}

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  AtomicFileWriter writer(path);
  writer.Write(bytes);
  writer.Commit();
}

}  // namespace trainyard
