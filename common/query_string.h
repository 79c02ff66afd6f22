// A URL's query string as names and values, for the read-only HTTP APIs (the dashboard's
// /api/jobs paging). It parses bytes a stranger sends, so it is one linear pass with
// bounds: at most kMaxQueryFields fields, each name and value percent-decoded
// (RFC 3986, section 2.1) with HTML forms' '+' for a space.
#pragma once

#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

namespace trainyard {

constexpr size_t kMaxQueryFields = 32;

class QueryError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The fields after the first '?' of a request target ("/api/jobs?limit=5&user=ann"):
// {name: value}. A field without '=' has an empty value and empty fields ("a=1&&b=2")
// are skipped. Throws QueryError, naming the field, for a malformed percent escape, a
// name given twice, or more than kMaxQueryFields fields.
std::map<std::string, std::string> ParseQueryString(std::string_view target);

}  // namespace trainyard
