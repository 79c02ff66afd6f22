#include "common/bounded_json.h"

#include <string>

namespace trainyard {

nlohmann::json ParseBoundedJson(std::string_view text, int max_depth) {
  using Event = nlohmann::json::parse_event_t;
  // The callback sees each array or object as it opens, with the number already open.
  auto bounded = [max_depth](int depth, Event event, nlohmann::json&) {
    if ((event == Event::array_start || event == Event::object_start) && depth >= max_depth)
      throw JsonTooDeep("JSON nested deeper than " + std::to_string(max_depth) + " levels");
    return true;
  };
  return nlohmann::json::parse(text, bounded);
}

nlohmann::json ParseBoundedJsonOrDiscarded(std::string_view text, int max_depth) {
  try {
    return ParseBoundedJson(text, max_depth);
  } catch (const std::exception&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

std::string DumpJsonForPeer(const nlohmann::json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trainyard
