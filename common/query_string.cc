#include "common/query_string.h"

#include <string>

namespace trainyard {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// At most 64 bytes of a field, for an error message.
std::string Shown(std::string_view text) {
  constexpr size_t kShown = 64;
  return text.size() <= kShown ? std::string(text) : std::string(text.substr(0, kShown)) + "...";
}

std::string PercentDecoded(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] != '%') {
      out += text[i];
    } else {
      const int high = i + 2 < text.size() ? HexDigit(text[i + 1]) : -1;
      const int low = i + 2 < text.size() ? HexDigit(text[i + 2]) : -1;
      if (high < 0 || low < 0)
        throw QueryError("'" + Shown(text) + "' has a '%' not followed by two hexadecimal digits");
      out += char(high * 16 + low);
      i += 2;
    }
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> ParseQueryString(std::string_view target) {
  std::map<std::string, std::string> fields;
  const size_t question = target.find('?');
  if (question == std::string_view::npos) return fields;
  std::string_view rest = target.substr(question + 1);
  size_t count = 0;
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view field = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (field.empty()) continue;
    if (++count > kMaxQueryFields)
      throw QueryError("the query has more than " + std::to_string(kMaxQueryFields) + " fields");
    const size_t equals = field.find('=');
    std::string name = PercentDecoded(field.substr(0, equals));
    std::string value = equals == std::string_view::npos ? "" : PercentDecoded(field.substr(equals + 1));
    if (fields.count(name)) throw QueryError("'" + Shown(name) + "' is given twice in the query");
    fields.emplace(std::move(name), std::move(value));
  }
  return fields;
}

}  // namespace trainyard
