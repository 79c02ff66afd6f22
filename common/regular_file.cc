#include "common/regular_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>
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
  int release() { return std::exchange(fd_, -1); }

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
  read.size = int64_t(used);
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

// Opens the folder of `relative`'s last component beneath `root`, following no
// symlink below `root`; -1 with errno set when it cannot. `parts` gets the components.
int OpenParentBeneath(const std::string& root, const std::string& relative, std::vector<std::string>* parts) {
  *parts = Components(relative);
  for (const std::string& part : *parts)
    if (part.empty() || part == "." || part == "..") {
      errno = EINVAL;
      return -1;
    }
  auto folder = std::make_unique<Fd>(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (folder->get() < 0) return -1;
  for (size_t i = 0; i + 1 < parts->size(); ++i) {
    const int next = ::openat(folder->get(), (*parts)[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return -1;
    folder = std::make_unique<Fd>(next);
  }
  return folder->release();
}

// Opens `relative` beneath `root` for reading, without following a link or blocking:
// its descriptor (owned by the caller), or -1 with `*failure` saying why not.
int OpenForReadBeneath(const std::string& root, const std::string& relative, const std::string& path,
                       FileRead* failure) {
  std::vector<std::string> parts;
  const Fd folder(OpenParentBeneath(root, relative, &parts));
  if (folder.get() < 0) {
    *failure = errno == EINVAL ? Failed(FileRead::kRefused, path, "not a plain path beneath " + root)
                               : OpenFailed(path, errno);
    return -1;
  }
  const int file = ::openat(folder.get(), parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (file < 0) *failure = OpenFailed(path, errno);
  return file;
}

}  // namespace

FileRead ReadFileBeneath(const std::string& root, const std::string& relative, size_t max_bytes) {
  const std::string path = root + "/" + relative;
  FileRead failure;
  const Fd file(OpenForReadBeneath(root, relative, path, &failure));
  if (file.get() < 0) return failure;
  return ReadOpened(file.get(), path, max_bytes);
}

FileRead ReadRangeBeneath(const std::string& root, const std::string& relative, int64_t offset, size_t max_bytes) {
  const std::string path = root + "/" + relative;
  FileRead failure;
  const Fd file(OpenForReadBeneath(root, relative, path, &failure));
  if (file.get() < 0) return failure;
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) return Failed(FileRead::kError, path, std::strerror(errno));
  if (!S_ISREG(info.st_mode)) return Failed(FileRead::kRefused, path, "not a regular file");
  FileRead read;
  read.size = info.st_size;
  read.status = FileRead::kOk;
  if (offset < 0 || offset >= info.st_size) return read;
  read.bytes.resize(std::min<size_t>(max_bytes, size_t(info.st_size - offset)));
  size_t used = 0;
  while (used < read.bytes.size()) {
    const ssize_t n = ::pread(file.get(), read.bytes.data() + used, read.bytes.size() - used, offset + off_t(used));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Failed(FileRead::kError, path, std::strerror(errno));
    if (n == 0) break;
    used += size_t(n);
  }
  read.bytes.resize(used);
  return read;
}

void AppendFileBeneath(const std::string& root, const std::string& relative, const std::string& bytes,
                       int64_t rotate_at) {
  const std::string path = root + "/" + relative;
  std::vector<std::string> parts;
  const Fd folder(OpenParentBeneath(root, relative, &parts));
  if (folder.get() < 0) throw std::runtime_error(path + ": " + std::strerror(errno));
  const std::string& name = parts.back();
  constexpr int kFlags = O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  auto file = std::make_unique<Fd>(::openat(folder.get(), name.c_str(), kFlags, 0644));
  struct stat info {};
  if (file->get() < 0 || ::fstat(file->get(), &info) != 0)
    throw std::runtime_error(path + ": " + (errno == ELOOP ? "a symbolic link (not followed)" : std::strerror(errno)));
  if (!S_ISREG(info.st_mode)) throw std::runtime_error(path + ": not a regular file");
  if (info.st_size > 0 && info.st_size + int64_t(bytes.size()) > rotate_at) {
    if (::renameat(folder.get(), name.c_str(), folder.get(), (name + ".1").c_str()) != 0)
      throw std::runtime_error(path + ": cannot rotate it: " + std::strerror(errno));
    file = std::make_unique<Fd>(::openat(folder.get(), name.c_str(), kFlags | O_EXCL, 0644));
    if (file->get() < 0) throw std::runtime_error(path + ": " + std::strerror(errno));
  }
  for (size_t used = 0; used < bytes.size();) {
    const ssize_t n = ::write(file->get(), bytes.data() + used, bytes.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(path + ": " + std::strerror(errno));
    used += size_t(n);
  }
}

namespace {

// Opens `relative` beneath the open folder `root_fd` as a folder, following no symlink.
int OpenFolderAt(int root_fd, const std::string& relative) {
  auto folder = std::make_unique<Fd>(::dup(root_fd));
  if (relative.empty()) return folder->release();
  for (const std::string& part : Components(relative)) {
    const int next = ::openat(folder->get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) return -1;
    folder = std::make_unique<Fd>(next);
  }
  return folder->release();
}

}  // namespace

std::vector<FileEntry> ListFilesBeneath(const std::string& root, const std::string& relative, size_t max_files,
                                        int max_depth, bool* truncated) {
  *truncated = false;
  const std::string path = root + "/" + relative;
  std::vector<std::string> parts;
  const Fd parent(OpenParentBeneath(root, relative, &parts));
  if (parent.get() < 0) {
    if (errno == ENOENT) return {};
    throw std::runtime_error(path + ": " +
                             (errno == EINVAL ? "not a plain path beneath " + root : std::strerror(errno)));
  }
  const Fd top(::openat(parent.get(), parts.back().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (top.get() < 0) {
    if (errno == ENOENT) return {};
    throw std::runtime_error(path + ": " +
                             (errno == ELOOP || errno == ENOTDIR ? "not a folder" : std::strerror(errno)));
  }
  std::vector<FileEntry> files;
  std::vector<std::pair<std::string, int>> pending{{"", 0}};  // folders to read: path beneath, depth
  while (!pending.empty()) {
    const auto [folder, depth] = pending.back();
    pending.pop_back();
    const int fd = OpenFolderAt(top.get(), folder);
    if (fd < 0) continue;  // replaced meanwhile
    std::unique_ptr<DIR, int (*)(DIR*)> dir(::fdopendir(fd), ::closedir);
    if (!dir) {
      ::close(fd);
      continue;
    }
    while (const dirent* entry = ::readdir(dir.get())) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      struct stat info {};
      if (::fstatat(::dirfd(dir.get()), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
      const std::string beneath = folder.empty() ? name : folder + "/" + name;
      if (S_ISDIR(info.st_mode) && depth + 1 < max_depth) {
        if (pending.size() < max_files)
          pending.emplace_back(beneath, depth + 1);
        else
          *truncated = true;
      } else if (S_ISREG(info.st_mode)) {
        if (files.size() == max_files) {
          *truncated = true;
          pending.clear();
          break;
        }
        files.push_back({beneath, int64_t(info.st_size), double(info.st_mtim.tv_sec) + info.st_mtim.tv_nsec * 1e-9});
      }
    }
  }
  std::sort(files.begin(), files.end(), [](const FileEntry& a, const FileEntry& b) { return a.path < b.path; });
  return files;
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
