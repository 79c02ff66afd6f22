// One line of a text file written on any system: "\n" and "\r\n" both end a line, and
// neither is part of it. Every line-oriented reader (labels, vocabularies, merges, TSV,
// plain text) goes through this, so a file saved on Windows reads as the same file.
#pragma once

#include <istream>
#include <string>

namespace trainyard {

// As std::getline, without a trailing '\r'.
inline bool ReadTextLine(std::istream& in, std::string& line) {
  if (!std::getline(in, line)) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

}  // namespace trainyard
