#include "common/spec/search_spec.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "common/spec/spec_reader.h"
#include "common/spec/yaml_budget.h"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using spec_reader::PathKind;
using spec_reader::PathProblem;
using spec_reader::SpecReader;

constexpr int kMaxTrials = 1000;
constexpr int kMaxParams = 64;
constexpr int kMaxEpochs = 100'000;
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53: every integer below is a double
// Room for ".t1000" after the search's name in its trials' names.
constexpr size_t kMaxSearchNameLength = spec_reader::kMaxNameLength - 6;
constexpr YamlBudget kSearchFileBudget{size_t(16) << 20, 1'000'000, 32};
// What the trials' job files may hold together: each is the base's text, kept in memory
// and in the store.
constexpr size_t kMaxTrialBytes = size_t(64) << 20;

const std::map<std::string, SearchMethod> kMethodNames = {
    {"asha", SearchMethod::kAsha}, {"random", SearchMethod::kRandom}, {"grid", SearchMethod::kGrid}};
const std::map<std::string, bool> kModeNames = {{"max", true}, {"min", false}};
const std::map<std::string, Distribution> kDistributionNames = {{"choice", Distribution::kChoice},
                                                                {"uniform", Distribution::kUniform},
                                                                {"log_uniform", Distribution::kLogUniform},
                                                                {"int_uniform", Distribution::kIntUniform}};

// SplitMix64 (Steele, Lea and Flood, 2014): Note [Trial draws].
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  double NextUnit() {
    state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t state_;
};

// The shortest text that reads back as `value` (as Python's repr does).
std::string ShortestText(double value) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

std::string Where(const std::string& source, const YAML::Node& node) {
  return source + ":" + std::to_string(node.Mark().line + 1) + ":" + std::to_string(node.Mark().column + 1);
}

// A parameter's key: job keys are lower-case words joined by dots.
bool IsDottedKey(const std::string& key) {
  if (key.empty() || key.size() > 200 || key.front() == '.' || key.back() == '.') return false;
  for (size_t i = 0; i < key.size(); ++i) {
    const char c = key[i];
    const bool word = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!word && !(c == '.' && key[i - 1] != '.')) return false;
  }
  return true;
}

double ReadBound(const SpecReader& r, const YAML::Node& node, const std::string& path) {
  if (!node.IsScalar()) r.Fail(node, path, "expected a number");
  double value = 0;
  try {
    value = node.as<double>();
  } catch (const YAML::BadConversion&) {
    r.Fail(node, path, "expected a number, got '" + node.Scalar() + "'");
  }
  if (!std::isfinite(value)) r.Fail(node, path, "expected a finite number, got '" + node.Scalar() + "'");
  return value;
}

void ReadRange(const SpecReader& r, const YAML::Node& range, const std::string& path, SearchParam* param) {
  if (!range.IsSequence() || range.size() != 2) r.Fail(range, path, "expected [low, high]");
  param->low = ReadBound(r, range[0], path + "[0]");
  param->high = ReadBound(r, range[1], path + "[1]");
  const bool integer = param->distribution == Distribution::kIntUniform;
  if (integer) {
    for (int i = 0; i < 2; ++i) {
      const double v = i == 0 ? param->low : param->high;
      if (v != std::floor(v) || std::fabs(v) > kMaxExactInteger)
        r.Fail(range[i], path + "[" + std::to_string(i) + "]", "expected an integer, got '" + range[i].Scalar() + "'");
    }
  }
  if (integer ? param->low > param->high : param->low >= param->high)
    r.Fail(range, path,
           std::string("expected low ") + (integer ? "<=" : "<") + " high, got [" + range[0].Scalar() + ", " +
               range[1].Scalar() + "]");
  if (param->distribution == Distribution::kLogUniform && param->low <= 0)
    r.Fail(range[0], path + "[0]", "expected a number above 0 (a log-uniform range), got '" + range[0].Scalar() + "'");
}

SearchParam ReadParam(const SpecReader& r, const std::string& source, const YAML::Node& key, const YAML::Node& value) {
  SearchParam param;
  param.key = key.Scalar();
  param.where = Where(source, key);
  const std::string path = "search.params." + param.key;
  if (!IsDottedKey(param.key)) r.Fail(key, path, "expected a job key in dotted form, e.g. train.lr");
  if (param.key == "name" || param.key == "kind")
    r.Fail(key, path, "a search sets each trial's " + param.key + " itself");
  if (!value.IsMap() || value.size() != 1)
    r.Fail(value, path,
           "expected one distribution: {choice: [...]}, {uniform: [low, high]}, "
           "{log_uniform: [low, high]} or {int_uniform: [low, high]}");
  const auto entry = *value.begin();
  param.distribution = r.Choice(entry.first, path, kDistributionNames);
  const std::string inner = path + "." + entry.first.Scalar();
  if (param.distribution != Distribution::kChoice) {
    ReadRange(r, entry.second, inner, &param);
    return param;
  }
  if (!entry.second.IsSequence() || entry.second.size() == 0) r.Fail(entry.second, inner, "expected a non-empty list");
  if (entry.second.size() > size_t(kMaxTrials))
    r.Fail(entry.second, inner, "expected at most " + std::to_string(kMaxTrials) + " values");
  for (size_t i = 0; i < entry.second.size(); ++i) {
    if (!entry.second[i].IsScalar())
      r.Fail(entry.second[i], inner + "[" + std::to_string(i) + "]", "expected a scalar");
    param.choices.push_back(entry.second[i].Scalar());
  }
  return param;
}

std::vector<SearchParam> ReadParams(const SpecReader& r, const std::string& source, const YAML::Node& search) {
  const YAML::Node params = search["params"];
  if (!params.IsDefined() || params.IsNull()) r.Fail(search, "search.params", "required: the parameters to vary");
  if (!params.IsMap() || params.size() == 0)
    r.Fail(params, "search.params", "expected a mapping of dotted job keys to distributions");
  if (params.size() > size_t(kMaxParams))
    r.Fail(params, "search.params", "expected at most " + std::to_string(kMaxParams) + " parameters");
  std::vector<SearchParam> out;
  std::set<std::string> seen;
  for (const auto& entry : params) {
    if (!entry.first.IsScalar()) r.Fail(entry.first, "search.params", "expected a plain key");
    if (!seen.insert(entry.first.Scalar()).second)
      r.Fail(entry.first, "search.params." + entry.first.Scalar(), "duplicate key; each key may appear once");
    out.push_back(ReadParam(r, source, entry.first, entry.second));
  }
  // A key and a key beneath it ("train" and "train.lr") would overwrite each other.
  for (const SearchParam& a : out)
    for (const SearchParam& b : out)
      if (b.key.rfind(a.key + ".", 0) == 0)
        r.Fail(params[b.key], "search.params." + b.key, "lies beneath search.params." + a.key);
  return out;
}

// One value of `param` for a draw `u` in [0, 1) (Note [Trial draws]).
std::string DrawValue(const SearchParam& param, double u) {
  switch (param.distribution) {
    case Distribution::kChoice:
      return param.choices[std::min(param.choices.size() - 1, size_t(u * double(param.choices.size())))];
    case Distribution::kUniform:
      return ShortestText(param.low + u * (param.high - param.low));
    case Distribution::kLogUniform:
      return ShortestText(std::exp(std::log(param.low) + u * (std::log(param.high) - std::log(param.low))));
    case Distribution::kIntUniform: {
      const double value = std::min(param.high, param.low + std::floor(u * (param.high - param.low + 1)));
      return std::to_string(static_cast<int64_t>(value));
    }
  }
  return "";
}

// The most bytes one trial's values add to its job file: each key with its longest value
// (a drawn number is at most 32 characters), and room for the YAML around them.
size_t MostValueBytes(const std::vector<SearchParam>& params) {
  size_t bytes = 0;
  for (const SearchParam& param : params) {
    size_t longest = 32;
    for (const std::string& choice : param.choices) longest = std::max(longest, choice.size());
    bytes += param.key.size() + longest + 16;
  }
  return bytes;
}

// Prices `count` trials of at most `trial_bytes` each before any is made: a search file
// of a few KiB must not expand into gigabytes of job files.
void CheckTrialBytes(const SpecReader& r, const YAML::Node& search, size_t count, size_t trial_bytes) {
  if (count == 0 || trial_bytes <= kMaxTrialBytes / count) return;
  r.Fail(search, "search",
         std::to_string(count) + " trials of up to " + std::to_string(trial_bytes >> 10) +
             " KiB each (the base and the longest values) would hold more than " +
             std::to_string(kMaxTrialBytes >> 20) +
             " MiB of job files; use fewer trials, shorter values or a "
             "smaller base");
}

std::vector<std::vector<std::string>> RandomValues(const SearchSpec& spec) {
  SplitMix64 random(spec.seed);
  std::vector<std::vector<std::string>> trials(spec.max_trials);
  for (auto& values : trials)
    for (const SearchParam& param : spec.params) values.push_back(DrawValue(param, random.NextUnit()));
  return trials;
}

// The values a grid takes of `param`; empty for a continuous distribution.
std::vector<std::string> GridValues(const SearchParam& param) {
  if (param.distribution == Distribution::kChoice) return param.choices;
  std::vector<std::string> values;
  if (param.distribution != Distribution::kIntUniform) return values;
  for (double v = param.low; v <= param.high && values.size() <= size_t(kMaxTrials); ++v)
    values.push_back(std::to_string(static_cast<int64_t>(v)));
  return values;
}

std::vector<std::vector<std::string>> GridTrials(const SpecReader& r, const YAML::Node& search, SearchSpec* spec,
                                                 size_t trial_bytes) {
  std::vector<std::vector<std::string>> axes;
  size_t size = 1;
  for (const SearchParam& param : spec->params) {
    axes.push_back(GridValues(param));
    if (axes.back().empty())
      r.Fail(search["params"][param.key], "search.params." + param.key,
             "method: grid takes choice or int_uniform values only");
    size *= axes.back().size();  // each axis holds at most kMaxTrials + 1 values
    if (size > size_t(kMaxTrials))
      r.Fail(search["params"], "search.params",
             "the grid has more than " + std::to_string(kMaxTrials) + " trials; use method: random or asha");
  }
  if (spec->max_trials > 0) size = std::min(size, size_t(spec->max_trials));
  CheckTrialBytes(r, search, size, trial_bytes);
  std::vector<std::vector<std::string>> trials;
  for (size_t t = 0; t < size; ++t) {  // mixed radix, the last parameter fastest
    std::vector<std::string> values(axes.size());
    size_t rest = t;
    for (size_t i = axes.size(); i-- > 0;) {
      values[i] = axes[i][rest % axes[i].size()];
      rest /= axes[i].size();
    }
    trials.push_back(std::move(values));
  }
  return trials;
}

struct Base {
  YAML::Node root;
  std::string source, base_dir;
  std::string text;  // a base file's own text (empty for an inline base)
  bool inline_base = false;
  YAML::Mark mark;  // where `base` is in the search file
};

std::string WithoutLocation(const std::string& message, const std::string& source) {
  if (message.rfind(source + ":", 0) != 0) return message;
  size_t at = source.size() + 1;
  for (int colons = 0; colons < 2 && at < message.size(); ++at) colons += message[at] == ':';
  while (at < message.size() && message[at] == ' ') ++at;
  return message.substr(at);
}

// Parses `text` as a job file, turning its SpecError into one located at `base` in the
// search file when the base is inline (its own lines are not the file's).
JobSpec CheckedJob(const std::string& text, const std::string& source, const Base& base, const std::string& context) {
  try {
    return ParseJobSpec(text, source, base.base_dir);
  } catch (const SpecError& e) {
    if (context.empty() && !base.inline_base) throw;
    throw SpecError(context + WithoutLocation(e.what(), source));
  }
}

Base ReadBase(const SpecReader& r, const YAML::Node& root, const std::string& source, const std::string& base_dir,
              const SearchBaseFile* sent) {
  const YAML::Node node = root["base"];
  if (!node.IsDefined() || node.IsNull()) r.Fail(root, "base", "required: the job file each trial varies");
  Base base;
  base.mark = node.Mark();
  if (node.IsMap()) {
    base.root = YAML::Clone(node);
    base.source = source + " (base)";
    base.base_dir = base_dir;
    base.inline_base = true;
    return base;
  }
  if (!node.IsScalar() || node.Scalar().empty()) r.Fail(node, "base", "expected a job file's path or its keys");
  fs::path path = fs::path(node.Scalar());
  if (path.is_relative()) path = fs::path(base_dir) / path;
  path = path.lexically_normal();
  if (sent) {
    if (sent->path != path.string())
      r.Fail(node, "base",
             "the submission does not carry " + path.string() +
                 "; submit the search with jobctl, "
                 "which sends its base file along");
    base.text = sent->text;
  } else {
    if (std::string problem = PathProblem(path, PathKind::kFile); !problem.empty()) r.Fail(node, "base", problem);
    base.text = ReadJobFile(path.string());
  }
  CheckYamlBudget(base.text, path.string(), kSearchFileBudget);
  base.source = path.string();
  base.base_dir = path.parent_path().string();
  try {
    base.root = YAML::Load(base.text);
  } catch (const YAML::Exception&) {  // the job parser below says where
    base.root = YAML::Node();
  }
  if (!base.root.IsMap()) CheckedJob(base.text, base.source, base, "");
  return base;
}

// Sets `key` (dotted) in the document `root` refers to; YAML::Node is a handle, so the
// caller's document changes.
void SetDotted(const YAML::Node& root, const std::string& key, const std::string& value) {
  YAML::Node node = root;
  size_t from = 0;
  for (size_t dot; (dot = key.find('.', from)) != std::string::npos; from = dot + 1) {
    const std::string part = key.substr(from, dot - from);
    if (!node[part].IsDefined() || node[part].IsNull()) node[part] = YAML::Node(YAML::NodeType::Map);
    if (!node[part].IsMap()) throw SpecError(key + ": '" + part + "' is not a section of the job file");
    node.reset(node[part]);
  }
  node[key.substr(from)] = value;
}

std::string TrialName(const std::string& search, int index, int count) {
  std::string digits = std::to_string(index);
  const size_t width = std::max<size_t>(2, std::to_string(count).size());
  return search + ".t" + std::string(width - std::min(width, digits.size()), '0') + digits;
}

std::string Describe(const std::vector<std::pair<std::string, std::string>>& params) {
  std::string out;
  for (const auto& [key, value] : params) out += (out.empty() ? "" : ", ") + key + "=" + value;
  return out;
}

SearchTrial BuildTrial(const SearchSpec& spec, const Base& base, int index, const std::vector<std::string>& values,
                       size_t count) {
  SearchTrial trial;
  trial.index = index;
  YAML::Node root = YAML::Clone(base.root);
  root["name"] = TrialName(spec.name, index, int(count));
  if (spec.method == SearchMethod::kAsha) SetDotted(root, "train.epochs", std::to_string(spec.asha.max_epochs));
  for (size_t i = 0; i < spec.params.size(); ++i) {
    trial.params.emplace_back(spec.params[i].key, values[i]);
    try {
      SetDotted(root, spec.params[i].key, values[i]);
    } catch (const SpecError& e) {
      throw SpecError(spec.params[i].where + ": search.params." + spec.params[i].key + ": " + e.what());
    }
  }
  YAML::Emitter out;
  out << root;
  trial.yaml = std::string(out.c_str()) + "\n";
  const std::string source = spec.source + " trial " + std::to_string(index);
  try {
    trial.spec = ParseJobSpec(trial.yaml, source, base.base_dir);
  } catch (const SpecError& e) {
    // A base that parses alone fails only through what the search set: name it.
    const std::string why = WithoutLocation(e.what(), source);
    std::string where = spec.source + ":" + std::to_string(base.mark.line + 1) + ":1: search";
    for (const SearchParam& p : spec.params)
      if (why.rfind(p.key + ":", 0) == 0) where = p.where + ": search.params." + p.key;
    throw SpecError(where + ": trial " + std::to_string(index) + " (" + Describe(trial.params) +
                    ") is not a valid job: " + why);
  }
  return trial;
}

void ReadAsha(const SpecReader& r, const YAML::Node& search, const JobSpec& base_spec, SearchSpec* spec) {
  const YAML::Node asha = search["asha"];
  if (spec->method != SearchMethod::kAsha) {
    if (asha.IsDefined()) r.Fail(asha, "search.asha", "only used by method: asha");
    return;
  }
  const YAML::Node node = r.Section(search, "asha", {"min_epochs", "reduction_factor", "max_epochs"});
  r.ReadInt(node, "min_epochs", "search.asha", &spec->asha.min_epochs, 1, kMaxEpochs);
  r.ReadInt(node, "reduction_factor", "search.asha", &spec->asha.reduction_factor, 2, 100);
  spec->asha.max_epochs = base_spec.train.epochs;
  r.ReadInt(node, "max_epochs", "search.asha", &spec->asha.max_epochs, 1, kMaxEpochs);
  if (spec->asha.min_epochs >= spec->asha.max_epochs)
    r.Fail(node["min_epochs"].IsDefined() ? node["min_epochs"] : search, "search.asha.min_epochs",
           "expected fewer than max_epochs (" + std::to_string(spec->asha.max_epochs) +
               ", the base's train.epochs unless asha.max_epochs says), or ASHA judges no trial");
}

void ReadSearchSection(const SpecReader& r, const YAML::Node& root, const JobSpec& base_spec, SearchSpec* spec) {
  const YAML::Node search = root["search"];
  if (!search.IsDefined() || search.IsNull()) r.Fail(root, "search", "required: what to vary and how");
  r.CheckKeys(search, "search", {"method", "metric", "mode", "max_trials", "max_concurrent", "seed", "params", "asha"});
  r.ReadEnum(search, "method", "search", kMethodNames, &spec->method);
  r.ReadString(search, "metric", "search", &spec->metric);
  const auto& metrics = SearchMetrics();
  if (std::find(metrics.begin(), metrics.end(), spec->metric) == metrics.end())
    r.Fail(search["metric"], "search.metric",
           "expected one of " + spec_reader::Join(metrics) + ", got '" + spec->metric + "'");
  if (spec->metric.rfind("eval_", 0) == 0 && base_spec.data.dev.empty())
    r.Fail(search["metric"], "search.metric", spec->metric + " needs data.dev in the base job");
  spec->maximize = spec->metric == "eval_acc" || spec->metric == "samples_per_s";
  r.ReadEnum(search, "mode", "search", kModeNames, &spec->maximize);
  r.ReadInt(search, "max_trials", "search", &spec->max_trials, 1, kMaxTrials);
  if (spec->max_trials == 0 && spec->method != SearchMethod::kGrid)
    r.Fail(search, "search.max_trials", std::string("required by method: ") + ToString(spec->method));
  r.ReadInt(search, "max_concurrent", "search", &spec->max_concurrent, 1, kMaxTrials);
  r.ReadInt(search, "seed", "search", &spec->seed, 0, std::numeric_limits<int64_t>::max());
  ReadAsha(r, search, base_spec, spec);
  spec->params = ReadParams(r, spec->source, search);
}

}  // namespace

std::vector<int> AshaSpec::Rungs() const {
  std::vector<int> rungs;
  for (int64_t epoch = min_epochs; epoch < max_epochs; epoch *= reduction_factor) rungs.push_back(int(epoch));
  return rungs;
}

const std::vector<std::string>& SearchMetrics() {
  static const std::vector<std::string> metrics = {"eval_acc", "eval_loss",   "train_loss",
                                                   "time_s",   "ms_per_step", "samples_per_s"};
  return metrics;
}

bool IsSearchFile(const std::string& yaml_text) {
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    return root.IsMap() && root["kind"].IsDefined() && root["kind"].IsScalar() && root["kind"].Scalar() == "search";
  } catch (const YAML::Exception&) {
    return false;
  }
}

SearchSpec ParseSearchSpec(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir,
                           const SearchBaseFile* sent) {
  CheckYamlBudget(yaml_text, source_name, kSearchFileBudget);
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap()) throw SpecError(source_name + ":1:1: <document>: expected a mapping of search keys");
    std::map<std::string, std::string> locations, values;
    SpecReader r(source_name, fs::path(base_dir), &locations, &values);
    r.CheckKeys(root, "", {"name", "kind", "base", "search"});
    SearchSpec spec;
    spec.source = source_name;
    if (!r.ReadString(root, "name", "", &spec.name)) r.Fail(root, "name", "required: the search's name");
    if (!spec_reader::IsSafeName(spec.name) || spec.name.size() > kMaxSearchNameLength)
      r.Fail(root["name"], "name",
             "expected one path component of letters, digits, '.', '_' or '-' (at most " +
                 std::to_string(kMaxSearchNameLength) + " characters, not '.' or '..')");
    const Base base = ReadBase(r, root, source_name, base_dir, sent);
    spec.base_dir = base.base_dir;
    if (!base.inline_base) {
      spec.base_path = base.source;
      spec.base_text = base.text;
    }
    YAML::Emitter emitted;
    emitted << base.root;
    const std::string context = base.inline_base ? source_name + ":" + std::to_string(base.mark.line + 1) + ":" +
                                                       std::to_string(base.mark.column + 1) + ": base: "
                                                 : "";
    // A base file is checked as written, so that its errors name its own lines.
    const JobSpec base_spec =
        CheckedJob(base.inline_base ? std::string(emitted.c_str()) + "\n" : base.text, base.source, base, context);
    if (base_spec.kind != JobKind::kFinetune)
      throw SpecError(base_spec.Where("kind") + ": a search's base must be kind: finetune (its trials report epochs)");
    ReadSearchSection(r, root, base_spec, &spec);
    const size_t trial_bytes = std::string(emitted.c_str()).size() + MostValueBytes(spec.params);
    if (spec.method != SearchMethod::kGrid) CheckTrialBytes(r, root["search"], size_t(spec.max_trials), trial_bytes);
    const auto values_of =
        spec.method == SearchMethod::kGrid ? GridTrials(r, root["search"], &spec, trial_bytes) : RandomValues(spec);
    for (size_t i = 0; i < values_of.size(); ++i)
      spec.trials.push_back(BuildTrial(spec, base, int(i + 1), values_of[i], values_of.size()));
    return spec;
  } catch (const YAML::Exception& e) {
    throw SpecError(source_name + ":" + std::to_string(std::max(e.mark.line, 0) + 1) + ":" +
                    std::to_string(std::max(e.mark.column, 0) + 1) + ": <document>: unusable YAML: " + e.msg);
  }
}

const char* ToString(SearchMethod method) {
  for (const auto& [name, m] : kMethodNames)
    if (m == method) return name.c_str();
  return "?";
}

}  // namespace trainyard
