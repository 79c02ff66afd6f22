// A size check for YAML text from an untrusted sender, made before yaml-cpp builds a
// node tree: the tree costs a few hundred bytes a node, so a 16 MiB list would hold
// gigabytes. The check streams the parser's events and keeps nothing.
#pragma once

#include <cstddef>
#include <string>

namespace trainyard {

struct YamlBudget {
  size_t max_bytes = 1 << 20;  // the text itself
  size_t max_nodes = 10000;    // scalars, sequences, maps and aliases, over every document
  size_t max_depth = 32;       // nesting of sequences and maps
};

// Throws SpecError ("<source>: ...") when `text` exceeds `budget`, or when it is not
// YAML at all ("<source>:<line>:<column>: ..."). Returns normally otherwise.
void CheckYamlBudget(const std::string& text, const std::string& source, const YamlBudget& budget);

}  // namespace trainyard
