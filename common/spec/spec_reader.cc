#include "common/spec/spec_reader.h"

namespace trainyard::spec_reader {

std::string PathProblem(const fs::path& path, PathKind kind) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  const bool exists = !error && fs::exists(status);
  if (kind == PathKind::kAny || (kind == PathKind::kFileIfPresent && !exists)) return "";
  if (!exists) return (kind == PathKind::kFolder ? "folder not found: " : "file not found: ") + path.string();
  if (kind == PathKind::kFolder) return fs::is_directory(status) ? "" : "not a folder: " + path.string();
  if (fs::is_regular_file(status)) return "";
  return std::string(fs::is_directory(status) ? "a folder" : "a special file (FIFO, device or socket)") +
         ", not a regular file: " + path.string();
}

bool IsSafeName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace trainyard::spec_reader
