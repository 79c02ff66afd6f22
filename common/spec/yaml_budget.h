// A size check for YAML text from an untrusted sender, made before yaml-cpp builds a
// node tree: the tree costs a few hundred bytes a node, so a 16 MiB list would hold
// gigabytes, and yaml-cpp's parser recurses once or more per level of nesting. The check
// streams the parser's events, keeps nothing, and stops at the first level too deep, so
// its own recursion is bounded by the budget too. ParseJobSpec applies a generous budget
// to every job file; jobctl and the coordinator a tighter one (--max-submit-bytes).
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
