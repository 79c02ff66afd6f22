// JSON from bytes someone else wrote (a client's request body, a worker's message, a
// file in a run folder), with its nesting bounded; and JSON that echoes such bytes back.
//
// nlohmann's parser keeps its own stack and destroys values iteratively, but whatever
// walks a value afterwards (dump(), our visitors) recurses once per level, so a body
// of a million '[' would overflow the stack there. These parse functions stop at
// `max_depth` open arrays and objects instead.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace trainyard {

inline constexpr int kMaxJsonDepth = 64;

class JsonTooDeep : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws JsonTooDeep past `max_depth` levels, and nlohmann::json::exception for text
// that is not JSON.
nlohmann::json ParseBoundedJson(std::string_view text, int max_depth = kMaxJsonDepth);

// As ParseBoundedJson, but a discarded value (is_discarded()) instead of any exception.
nlohmann::json ParseBoundedJsonOrDiscarded(std::string_view text, int max_depth = kMaxJsonDepth);

// Serialises `value` for a peer. A string holding bytes that are not UTF-8 (a client's
// header or path quoted in an error message) is written with U+FFFD in their place,
// where dump() would throw and turn the client's mistake into a 500.
std::string DumpJsonForPeer(const nlohmann::json& value, int indent = -1);

}  // namespace trainyard
