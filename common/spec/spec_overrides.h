// What changes a job file's document between its text and its schema: `--set key=value`
// overrides and ${VAR} expansion from the environment (SpecOverrides in job_spec.h).
// Both act on the parsed YAML tree, never on the text, so no value can bring in keys or
// structure the file did not have. Torch-free; used only by the spec parsers.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"

namespace trainyard::spec_overrides {

// Sets `set` in `root` (its value parsed as YAML, a scalar or a flow collection, unless
// literal), making the mappings on the way where they are missing, and records its
// origin as where the key came from in `origins` (key path -> origin). Throws SpecError
// naming the origin when the value is malformed or a key on the way is not a mapping.
void ApplySet(YAML::Node& root, const SpecOverrides::Set& set, std::map<std::string, std::string>* origins);

// The keys of "a.b.c"; throws SpecError naming `origin` for an empty one.
std::vector<std::string> SplitKeyPath(const std::string& path, const std::string& origin);

// Expands ${VAR} and ${VAR:-default} in every scalar value of `root` (not in keys) from
// the environment; $${ stands for a literal ${. An unset variable without a default, or
// a malformed reference, is a SpecError located at the value ("<source>:<line>:<col>:
// <key.path>: ..."). Walks the tree with a stack of its own, not by recursion, and each
// node once however many aliases lead to it.
void ExpandEnvironment(YAML::Node root, const std::string& source);

}  // namespace trainyard::spec_overrides
