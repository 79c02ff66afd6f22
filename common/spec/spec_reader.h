// The walker of a parsed job or search file (common/spec/job_spec.h,
// common/spec/search_spec.h): every problem becomes a SpecError that points at the
// offending node as "<file>:<line>:<column>: <key.path>: <what was expected>".
// Torch-free; used only by the spec parsers.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"

namespace trainyard::spec_reader {

namespace fs = std::filesystem;

inline constexpr size_t kMaxNameLength = 100;

// What a path read from the job file must be at load time. The checks follow symlinks.
enum class PathKind {
  kAny,            // nothing checked (written later, e.g. log.runs_dir)
  kFile,           // an existing regular file: not a folder, FIFO, socket or device
  kFileIfPresent,  // a regular file if it exists (created otherwise)
  kFolder,         // an existing folder
};

// "" when `path` is acceptable as `kind`, else what is wrong with it. Never throws.
std::string PathProblem(const fs::path& path, PathKind kind);

// A job name becomes a folder under runs/: one path component of [A-Za-z0-9._-],
// neither "." nor "..", so it can never reach outside runs/ or span lines in logs.
bool IsSafeName(const std::string& name);

size_t EditDistance(const std::string& a, const std::string& b);
std::string Join(const std::vector<std::string>& items);

// Walks one parsed YAML document, turning every problem into a SpecError that
// points at the offending node.
class SpecReader {
 public:
  SpecReader(std::string source, fs::path base_dir, std::map<std::string, std::string>* locations,
             std::map<std::string, std::string>* values)
      : source_(std::move(source)), base_dir_(std::move(base_dir)), locations_(locations), values_(values) {}

  // Keys set on the command line (--set), by key path: what they and the keys beneath
  // them are located at in messages, instead of a place in the file.
  void set_origins(const std::map<std::string, std::string>* origins) { origins_ = origins; }

  // "<file>:<line>:<column>" of `at`, or the --set that gave `key_path` or a key above
  // it, or else one beneath it (a section a --set made).
  std::string Location(const YAML::Node& at, const std::string& key_path) const {
    for (std::string path = key_path; origins_ && !path.empty();) {
      if (auto it = origins_->find(path); it != origins_->end()) return it->second;
      const size_t parent = path.find_last_of(".[");
      if (parent == std::string::npos) break;
      path.resize(parent);
    }
    if (auto it =
            origins_ ? origins_->lower_bound(key_path + ".") : std::map<std::string, std::string>::const_iterator();
        origins_ && it != origins_->end() && it->first.rfind(key_path + ".", 0) == 0)
      return it->second;
    return source_ + ":" + std::to_string(at.Mark().line + 1) + ":" + std::to_string(at.Mark().column + 1);
  }

  [[noreturn]] void Fail(const YAML::Node& at, const std::string& key_path, const std::string& message) const {
    throw SpecError(Location(at, key_path) + ": " + key_path + ": " + message);
  }

  static std::string Child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  // Rejects keys outside `allowed`, suggesting the nearest valid one.
  void CheckKeys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& allowed) const {
    if (!map.IsMap()) Fail(map, path.empty() ? "<document>" : path, "expected a mapping of keys");
    std::vector<std::string> seen;
    for (const auto& entry : map) {
      // A complex key (`? [a, b]`) or a null one would make as<std::string>() throw.
      if (!entry.first.IsScalar()) Fail(entry.first, path.empty() ? "<document>" : path, "expected a plain key");
      const std::string key = entry.first.Scalar();
      if (std::find(seen.begin(), seen.end(), key) != seen.end())
        Fail(entry.first, Child(path, key), "duplicate key; each key may appear once");
      seen.push_back(key);
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string nearest = allowed.front();
      for (const auto& candidate : allowed)
        if (EditDistance(key, candidate) < EditDistance(key, nearest)) nearest = candidate;
      std::string hint = EditDistance(key, nearest) <= std::max<size_t>(2, key.size() / 3)
                             ? "did you mean '" + nearest + "'?"
                             : "valid keys: " + Join(allowed);
      Fail(entry.first, Child(path, key), "unknown key; " + hint);
    }
  }

  template <typename T>
  bool Read(const YAML::Node& map, const std::string& key, const std::string& path, T* out,
            const char* expected) const {
    const YAML::Node node = map[key];
    if (!node.IsDefined() || node.IsNull()) return false;
    if (!node.IsScalar()) Fail(node, Child(path, key), std::string("expected ") + expected);
    (*locations_)[Child(path, key)] = Location(node, Child(path, key));
    (*values_)[Child(path, key)] = node.Scalar();
    try {
      *out = node.as<T>();
    } catch (const YAML::BadConversion&) {
      Fail(node, Child(path, key), std::string("expected ") + expected + ", got '" + node.Scalar() + "'");
    }
    return true;
  }

  bool ReadString(const YAML::Node& m, const std::string& k, const std::string& p, std::string* out) const {
    return Read(m, k, p, out, "a string");
  }
  // Reads an integer in [min_value, max_value]; the bounds must fit `Int`, so the value
  // is narrowed only after it was checked against the field's real range.
  template <typename Int>
  void ReadInt(const YAML::Node& m, const std::string& k, const std::string& p, Int* out, int64_t min_value,
               int64_t max_value) const {
    if (!FitsIn<Int>(min_value) || !FitsIn<Int>(max_value) || min_value > max_value)
      throw std::logic_error("ReadInt: bad bounds for " + Child(p, k));
    int64_t value = 0;
    if (!Read(m, k, p, &value, "an integer")) return;
    if (value < min_value || value > max_value)
      Fail(m[k], Child(p, k),
           "expected an integer in [" + std::to_string(min_value) + ", " + std::to_string(max_value) + "], got " +
               std::to_string(value));
    *out = static_cast<Int>(value);
  }
  template <typename Int>
  static bool FitsIn(int64_t v) {
    if (v < 0) return std::numeric_limits<Int>::is_signed && v >= static_cast<int64_t>(std::numeric_limits<Int>::min());
    return static_cast<uint64_t>(v) <= static_cast<uint64_t>(std::numeric_limits<Int>::max());
  }
  // Reads a finite number in [lo, hi]: NaN compares false with every bound, so it is
  // refused by name, as are the infinities.
  void ReadDouble(const YAML::Node& m, const std::string& k, const std::string& p, double* out, double lo,
                  double hi) const {
    if (!Read(m, k, p, out, "a number")) return;
    if (!std::isfinite(*out)) Fail(m[k], Child(p, k), "expected a finite number, got '" + m[k].Scalar() + "'");
    if (*out < lo || *out > hi) {
      std::ostringstream msg;
      msg << "expected a number in [" << lo << ", " << hi << "], got " << *out;
      Fail(m[k], Child(p, k), msg.str());
    }
  }
  void ReadBool(const YAML::Node& m, const std::string& k, const std::string& p, bool* out) const {
    Read(m, k, p, out, "true or false");
  }

  template <typename E>
  void ReadEnum(const YAML::Node& m, const std::string& k, const std::string& p,
                const std::map<std::string, E>& choices, E* out) const {
    std::string text;
    if (!ReadString(m, k, p, &text)) return;
    auto it = choices.find(text);
    if (it == choices.end()) {
      std::vector<std::string> names;
      names.reserve(choices.size());
      for (const auto& c : choices) names.push_back(c.first);
      Fail(m[k], Child(p, k), "expected one of " + Join(names) + ", got '" + text + "'");
    }
    *out = it->second;
  }

  // `raw` as a path read from the job file means it: against the job file's folder.
  fs::path Resolve(const std::string& raw) const {
    return (fs::path(raw).is_absolute() ? fs::path(raw) : base_dir_ / raw).lexically_normal();
  }

  // Reads a path, resolves it against the job file's folder, and checks it is `kind`.
  bool ReadPath(const YAML::Node& m, const std::string& k, const std::string& p, std::string* out,
                PathKind kind) const {
    std::string raw;
    if (!ReadString(m, k, p, &raw)) return false;
    if (raw.empty() || raw.find('\0') != std::string::npos) Fail(m[k], Child(p, k), "expected a path");
    fs::path resolved = fs::path(raw).is_absolute() ? fs::path(raw) : base_dir_ / raw;
    *out = resolved.lexically_normal().string();
    if (std::string problem = PathProblem(*out, kind); !problem.empty()) Fail(m[k], Child(p, k), problem);
    return true;
  }

  // A non-empty YAML sequence of scalars, each converted by `convert` (which calls Fail
  // through `fail_item` for a bad element).
  template <typename T, typename Convert>
  bool ReadList(const YAML::Node& m, const std::string& k, const std::string& p, std::vector<T>* out,
                Convert convert) const {
    const YAML::Node node = m[k];
    if (!node.IsDefined() || node.IsNull()) return false;
    (*locations_)[Child(p, k)] = Location(node, Child(p, k));
    if (!node.IsSequence()) Fail(node, Child(p, k), "expected a list, e.g. [1, 2, 4]");
    if (node.size() == 0) Fail(node, Child(p, k), "expected a non-empty list");
    out->clear();
    std::string text;
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item_path = Child(p, k) + "[" + std::to_string(i) + "]";
      if (!node[i].IsScalar()) Fail(node[i], item_path, "expected a scalar");
      out->push_back(convert(node[i], item_path));
      text += (i ? ", " : "") + node[i].Scalar();
    }
    (*values_)[Child(p, k)] = "[" + text + "]";
    return true;
  }

  int PositiveInt(const YAML::Node& n, const std::string& path, int max_value) const {
    int64_t value = 0;
    try {
      value = n.as<int64_t>();
    } catch (const YAML::BadConversion&) {
      Fail(n, path, "expected an integer, got '" + n.Scalar() + "'");
    }
    if (value < 1 || value > max_value)
      Fail(n, path, "expected an integer in [1, " + std::to_string(max_value) + "], got " + std::to_string(value));
    return static_cast<int>(value);
  }

  template <typename E>
  E Choice(const YAML::Node& n, const std::string& path, const std::map<std::string, E>& choices) const {
    auto it = choices.find(n.Scalar());
    if (it != choices.end()) return it->second;
    std::vector<std::string> names;
    names.reserve(choices.size());
    for (const auto& c : choices) names.push_back(c.first);
    Fail(n, path, "expected one of " + Join(names) + ", got '" + n.Scalar() + "'");
  }

  YAML::Node Section(const YAML::Node& root, const std::string& key, const std::vector<std::string>& allowed) const {
    YAML::Node node = root[key];
    if (!node.IsDefined() || node.IsNull()) return YAML::Node(YAML::NodeType::Map);
    CheckKeys(node, key, allowed);
    return node;
  }

 private:
  std::string source_;
  fs::path base_dir_;
  std::map<std::string, std::string>* locations_;
  std::map<std::string, std::string>* values_;
  const std::map<std::string, std::string>* origins_ = nullptr;
};

}  // namespace trainyard::spec_reader
