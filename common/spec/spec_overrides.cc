#include "common/spec/spec_overrides.h"

#include <cctype>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include "common/spec/job_spec.h"
#include "common/spec/yaml_budget.h"

namespace trainyard::spec_overrides {
namespace {

// A --set value is one YAML value on the command line: far below a job file's budget.
constexpr YamlBudget kSetValueBudget{size_t(64) << 10, 10'000, 8};

bool IsVariableName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

}  // namespace

std::vector<std::string> SplitKeyPath(const std::string& path, const std::string& origin) {
  std::vector<std::string> keys;
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    keys.push_back(path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (keys.back().empty()) throw SpecError(origin + ": expected KEY.PATH=VALUE, e.g. train.lr=3e-5");
    if (dot == std::string::npos) return keys;
    begin = dot + 1;
  }
}

namespace {

// `text` with its ${...} references expanded; throws SpecError through `fail`.
template <typename Fail>
std::string Expand(const std::string& text, const Fail& fail) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 2;
      continue;
    }
    if (text.compare(i, 2, "${") != 0) {
      out += text[i];
      continue;
    }
    const size_t end = text.find('}', i + 2);
    if (end == std::string::npos) fail("an unterminated ${ (write $${ for a literal ${)");
    const std::string inside = text.substr(i + 2, end - i - 2);
    const size_t dash = inside.find(":-");
    const std::string name = inside.substr(0, dash);
    if (!IsVariableName(name))
      fail("'${" + inside.substr(0, 60) + "}' is not a variable reference: expected ${NAME} or ${NAME:-default}");
    const char* value = std::getenv(name.c_str());
    if (value)
      out += value;
    else if (dash != std::string::npos)
      out += inside.substr(dash + 2);
    else
      fail("${" + name + "} is not set in the environment (${" + name + ":-default} gives a default)");
    i = end;
  }
  return out;
}

}  // namespace

void ApplySet(YAML::Node& root, const SpecOverrides::Set& set, std::map<std::string, std::string>* origins) {
  const std::string& origin = set.origin;
  const std::vector<std::string> keys = SplitKeyPath(set.key_path, origin);
  YAML::Node value;
  if (set.literal) {
    value = YAML::Node(set.value);
  } else {
    const std::string where = origin + ": " + set.key_path + ": the value";
    if (set.value.size() > kSetValueBudget.max_bytes)
      throw SpecError(where + " is " + std::to_string(set.value.size()) + " bytes; at most " +
                      std::to_string(kSetValueBudget.max_bytes) + " are accepted");
    try {
      CheckYamlBudget(set.value, "", kSetValueBudget);
      value = YAML::Load(set.value);
    } catch (const SpecError& e) {  // ":<line>:<column>: <document>: <problem>"
      const std::string what = e.what();
      const size_t problem = what.find("<document>: ");
      throw SpecError(where + ": " + (problem == std::string::npos ? what : what.substr(problem + 12)));
    } catch (const YAML::Exception& e) {
      throw SpecError(where + ": malformed YAML: " + e.msg);
    }
  }
  YAML::Node at = root;
  std::string walked;
  for (size_t k = 0; k + 1 < keys.size(); ++k) {
    walked += (k ? "." : "") + keys[k];
    YAML::Node next = at[keys[k]];
    if (!next.IsDefined() || next.IsNull()) {
      next = YAML::Node(YAML::NodeType::Map);
      at[keys[k]] = next;
    } else if (!next.IsMap()) {
      throw SpecError(origin + ": " + walked + ": not a mapping in the job file, so it has no key '" + keys[k + 1] +
                      "'");
    }
    at.reset(next);
  }
  at[keys.back()] = value;
  (*origins)[set.key_path] = origin;
}

void ExpandEnvironment(YAML::Node root, const std::string& source) {
  // An alias makes one node reachable by several paths, and can make a map contain
  // itself: each node is visited once, known by where it starts in the text and its type.
  std::set<std::pair<int, int>> visited;
  std::vector<std::pair<YAML::Node, std::string>> stack = {{root, ""}};
  while (!stack.empty()) {
    // Copies, not a structured binding: the lambda below captures them (C++17).
    YAML::Node node = stack.back().first;
    const std::string path = stack.back().second;
    stack.pop_back();
    if (!visited.insert({node.Mark().pos, int(node.Type())}).second) continue;
    if (node.IsMap()) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        const std::string key = it->first.IsScalar() ? it->first.Scalar() : "?";
        stack.emplace_back(it->second, path.empty() ? key : path + "." + key);
      }
    } else if (node.IsSequence()) {
      for (size_t i = 0; i < node.size(); ++i) stack.emplace_back(node[i], path + "[" + std::to_string(i) + "]");
    } else if (node.IsScalar() && node.Scalar().find('$') != std::string::npos) {
      const YAML::Mark mark = node.Mark();
      auto fail = [&](const std::string& problem) {
        throw SpecError(source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1) + ": " +
                        (path.empty() ? "<document>" : path) + ": " + problem);
      };
      node = Expand(node.Scalar(), fail);
    }
  }
}

}  // namespace trainyard::spec_overrides

namespace trainyard {

void SpecOverrides::AddAssignment(const std::string& assignment) {
  const std::string origin = "--set " + assignment.substr(0, 200);
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0)
    throw SpecError(origin + ": expected KEY.PATH=VALUE, e.g. train.lr=3e-5");
  spec_overrides::SplitKeyPath(assignment.substr(0, equals), origin);  // throws for an empty key
  sets.push_back({assignment.substr(0, equals), assignment.substr(equals + 1), false, origin});
}

void SpecOverrides::Add(const std::string& key_path, const std::string& value, const std::string& origin,
                        bool literal) {
  sets.push_back({key_path, value, literal, origin});
}

}  // namespace trainyard
