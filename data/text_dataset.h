// Labelled text datasets read from TSV or JSONL files, held in memory.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace trainyard {

// A dataset file that cannot be used; what() names file:line and the problem.
class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Example {
  std::string text;
  int label = -1;
};

// Label names in id order. Ids are positions in this list.
class LabelSet {
 public:
  LabelSet() = default;
  explicit LabelSet(std::vector<std::string> names) : names_(std::move(names)) {}
  static LabelSet FromFile(const std::string& path);  // one label a line
  int IdOf(const std::string& name) const;            // -1 if absent
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }

 private:
  std::vector<std::string> names_;
};

struct TextDataset {
  std::string path;
  std::vector<Example> examples;
};

struct TextFormat {
  bool jsonl = false;
  std::string text_field = "text", label_field = "label";  // JSONL only
  bool plain_text = false;                                 // one text a line, no labels (a language model's corpus)
};

// Reads every example. TSV: a header line "label<TAB>text", then one example a line,
// the text with \t \n \\ escapes. JSONL: one object a line with the two fields.
// Plain text: one text a line with the TSV's escapes, blank lines skipped, every label
// -1 (`labels` is left alone).
// With an empty `labels`, labels are collected from the file (sorted) into *labels;
// otherwise a label outside *labels is an error. Throws DatasetError.
TextDataset ReadTextDataset(const std::string& path, const TextFormat& format, LabelSet* labels);

// Unescapes the TSV text column (\t, \n, \\).
std::string UnescapeTsvField(const std::string& field);

}  // namespace trainyard
