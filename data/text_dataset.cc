#include "data/text_dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/text_line.h"

namespace trainyard {
namespace {

struct RawRow {
  std::string label, text;
  int line = 0;
};

[[noreturn]] void Fail(const std::string& path, int line, const std::string& message) {
  throw DatasetError(path + ":" + std::to_string(line) + ": " + message);
}

std::vector<RawRow> ReadTsvRows(const std::string& path, std::ifstream& in) {
  std::vector<RawRow> rows;
  std::string line;
  int number = 0;
  while (ReadTextLine(in, line)) {
    ++number;
    if (number == 1 && line.rfind("label\t", 0) == 0) continue;  // header
    if (line.empty()) continue;
    size_t tab = line.find('\t');
    if (tab == std::string::npos) Fail(path, number, "expected 'label<TAB>text', found no tab");
    rows.push_back({line.substr(0, tab), UnescapeTsvField(line.substr(tab + 1)), number});
  }
  return rows;
}

std::vector<RawRow> ReadJsonlRows(const std::string& path, std::ifstream& in, const TextFormat& format) {
  std::vector<RawRow> rows;
  std::string line;
  int number = 0;
  while (ReadTextLine(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      Fail(path, number, std::string("malformed JSON: ") + e.what());
    }
    for (const auto* field : {&format.text_field, &format.label_field})
      if (!object.is_object() || !object.contains(*field) || !object[*field].is_string())
        Fail(path, number, "expected a string field '" + *field + "'");
    rows.push_back(
        {object[format.label_field].get<std::string>(), object[format.text_field].get<std::string>(), number});
  }
  return rows;
}

std::vector<RawRow> ReadPlainTextRows(std::ifstream& in) {
  std::vector<RawRow> rows;
  std::string line;
  for (int number = 1; ReadTextLine(in, line); ++number) {
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    rows.push_back({"", UnescapeTsvField(line), number});
  }
  return rows;
}

}  // namespace

std::string UnescapeTsvField(const std::string& field) {
  std::string out;
  out.reserve(field.size());
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] != '\\' || i + 1 == field.size()) {
      out += field[i];
      continue;
    }
    char next = field[++i];
    out += next == 'n' ? '\n' : next == 't' ? '\t' : next;
  }
  return out;
}

LabelSet LabelSet::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DatasetError(path + ":0: cannot open the labels file");
  std::vector<std::string> names;
  std::string line;
  while (ReadTextLine(in, line))
    if (!line.empty()) names.push_back(line);
  if (names.empty()) throw DatasetError(path + ":1: the labels file lists no label");
  return LabelSet(std::move(names));
}

int LabelSet::IdOf(const std::string& name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  return it == names_.end() ? -1 : static_cast<int>(it - names_.begin());
}

TextDataset ReadTextDataset(const std::string& path, const TextFormat& format, LabelSet* labels) {
  std::ifstream in(path);
  if (!in) throw DatasetError(path + ":0: cannot open the dataset file");
  std::vector<RawRow> rows = format.plain_text ? ReadPlainTextRows(in)
                             : format.jsonl    ? ReadJsonlRows(path, in, format)
                                               : ReadTsvRows(path, in);
  if (rows.empty()) throw DatasetError(path + ":1: the dataset holds no example");
  if (format.plain_text) {
    TextDataset dataset{path, {}};
    for (auto& row : rows) dataset.examples.push_back({std::move(row.text), -1});
    return dataset;
  }
  if (labels->size() == 0) {
    std::set<std::string> seen;
    for (const auto& row : rows) seen.insert(row.label);
    *labels = LabelSet(std::vector<std::string>(seen.begin(), seen.end()));
  }
  TextDataset dataset{path, {}};
  dataset.examples.reserve(rows.size());
  for (auto& row : rows) {
    int id = labels->IdOf(row.label);
    if (id < 0) Fail(path, row.line, "unknown label '" + row.label + "'");
    dataset.examples.push_back({std::move(row.text), id});
  }
  return dataset;
}

}  // namespace trainyard
