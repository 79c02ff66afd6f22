// Reading files that someone else may have put in our way without blocking on them.
//
// A daemon that reads a file a job wrote (an SVG, a JSON) runs that job's risks: a FIFO
// blocks open() and read() for ever, /dev/zero never ends, and a symlink points
// anywhere. These readers open without following the last link (or, beneath a root,
// any link), without blocking (O_NONBLOCK), check with fstat that what they opened is
// a regular file, and read at most a cap. Each answer says why it read nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainyard {

struct FileRead {
  enum Status {
    kOk,
    kMissing,   // nothing at the path (or a folder on the way is missing)
    kRefused,   // a symlink, FIFO, device, folder or other non-regular file
    kTooLarge,  // larger than the cap
    kError,     // any other error; `why` holds it
  };
  Status status = kError;
  std::string bytes;  // kOk only
  int64_t size = 0;   // kOk: the whole file's size (ReadRangeBeneath reads a part of it)
  std::string why;    // not kOk: "<path>: <reason>"

  bool ok() const { return status == kOk; }
};

// `relative` (components split by '/'; none may be "..", "." or empty) beneath the
// folder `root`: no component below `root` may be a symlink.
FileRead ReadFileBeneath(const std::string& root, const std::string& relative, size_t max_bytes);

// At most `max_bytes` of the file `relative` beneath `root` (as ReadFileBeneath), from
// byte `offset` on; a file shorter than that gives no bytes. Never kTooLarge.
FileRead ReadRangeBeneath(const std::string& root, const std::string& relative, int64_t offset, size_t max_bytes);

// Appends `bytes` to the regular file `relative` beneath `root` (created 0644; its
// folder must exist; no symlink below `root`). A file that would grow past
// `rotate_at` bytes is renamed to <name>.1 first (replacing one there), and `bytes`
// start a new one. Throws std::runtime_error naming the path.
void AppendFileBeneath(const std::string& root, const std::string& relative, const std::string& bytes,
                       int64_t rotate_at);

// A regular file found by ListFilesBeneath.
struct FileEntry {
  std::string path;  // beneath the folder listed, '/' between folders
  int64_t size = 0;
  double modified = 0;  // Unix seconds
};

// The regular files in the folder `relative` beneath `root` and its subfolders, by path:
// no symlink is followed (below `root`, or in the tree), nothing but regular files is
// listed, at most `max_files` (`*truncated` says whether there were more) and
// `max_depth` folders deep. Iterative: the tree's depth never grows the stack. Throws
// std::runtime_error naming the path when the folder cannot be opened; a missing one
// lists as empty.
std::vector<FileEntry> ListFilesBeneath(const std::string& root, const std::string& relative, size_t max_files,
                                        int max_depth, bool* truncated);

// Creates the folders of `relative` beneath the folder `root` as needed. Throws
// std::runtime_error naming the path if a component below `root` is a symlink or not a
// folder: what is then written there stays beneath `root`.
void MakeFoldersBeneath(const std::string& root, const std::string& relative);

// `path` as a user named it: symlinks are followed (the user chose them), but the file
// reached must be regular and at most `max_bytes`.
FileRead ReadUserFile(const std::string& path, size_t max_bytes);

}  // namespace trainyard
