#include "common/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace trainyard {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

FileRead Failed(FileRead::Status status, const std::string& path, const std::string& reason) {
  FileRead read;
  read.status = status;
  read.why = path + ": " + reason;
  return read;
}

// What open()'s errno says about `path`.
FileRead OpenFailed(const std::string& path, int error) {
  if (error == ENOENT) return Failed(FileRead::kMissing, path, "no such file");
  if (error == ENOTDIR) return Failed(FileRead::kRefused, path, "something other than a folder on its way");
  if (error == ELOOP) return Failed(FileRead::kRefused, path, "a symbolic link (not followed)");
  return Failed(FileRead::kError, path, std::strerror(error));
}

FileRead ReadOpened(int fd, const std::string& path, size_t max_bytes) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) return Failed(FileRead::kError, path, std::strerror(errno));
  if (!S_ISREG(info.st_mode)) return Failed(FileRead::kRefused, path, "not a regular file");
  if (size_t(info.st_size) > max_bytes)
    return Failed(FileRead::kTooLarge, path,
                  std::to_string(info.st_size) + " bytes, more than the " + std::to_string(max_bytes) + " read here");
  FileRead read;
  read.bytes.resize(max_bytes < size_t(info.st_size) + 1 ? max_bytes + 1 : size_t(info.st_size) + 1);
  size_t used = 0;
  while (used < read.bytes.size()) {  // one more byte than the cap: a file that grew is caught
    const ssize_t n = ::read(fd, read.bytes.data() + used, read.bytes.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Failed(FileRead::kError, path, std::strerror(errno));
    if (n == 0) break;
    used += size_t(n);
  }
  if (used > max_bytes)
    return Failed(FileRead::kTooLarge, path, "more than the " + std::to_string(max_bytes) + " bytes read here");
  read.bytes.resize(used);
  read.status = FileRead::kOk;
  return read;
}

std::vector<std::string> Components(const std::string& relative) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (;;) {
    const size_t slash = relative.find('/', begin);
    parts.push_back(relative.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin));
    if (slash == std::string::npos) return parts;
    begin = slash + 1;
  }
}

}  // namespace

FileRead ReadFileBeneath(const std::string& root, const std::string& relative, size_t max_bytes) {
  const std::string path = root + "/" + relative;
  const std::vector<std::string> parts = Components(relative);
  for (const std::string& part : parts)
    if (part.empty() || part == "." || part == "..")
      return Failed(FileRead::kRefused, path, "not a plain path beneath " + root);
  auto folder = std::make_unique<Fd>(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (folder->get() < 0) return OpenFailed(root, errno);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int next = ::openat(folder->get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return OpenFailed(path, errno);
    folder = std::make_unique<Fd>(next);
  }
  const Fd file(::openat(folder->get(), parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) return OpenFailed(path, errno);
  return ReadOpened(file.get(), path, max_bytes);
}

void MakeFoldersBeneath(const std::string& root, const std::string& relative) {
  const std::string path = root + "/" + relative;
  auto folder = std::make_unique<Fd>(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (folder->get() < 0) throw std::runtime_error(root + ": " + std::strerror(errno));
  for (const std::string& part : Components(relative)) {
    if (part.empty() || part == "." || part == "..")
      throw std::runtime_error(path + ": not a plain path beneath " + root);
    if (::mkdirat(folder->get(), part.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error(path + ": cannot create " + part + ": " + std::strerror(errno));
    const int next = ::openat(folder->get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0)
      throw std::runtime_error(path + ": " + part + " is " +
                               (errno == ELOOP || errno == ENOTDIR ? "a symbolic link or a file, not a folder"
                                                                   : std::string(std::strerror(errno))));
    folder = std::make_unique<Fd>(next);
  }
}

FileRead ReadUserFile(const std::string& path, size_t max_bytes) {
  const Fd file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) return OpenFailed(path, errno);
  return ReadOpened(file.get(), path, max_bytes);
}

}  // namespace trainyard
