#include "proto/wire_names.h"

#include <cctype>

namespace trainyard {
namespace {

constexpr std::string_view kJobPrefix = "JOB_";
constexpr std::string_view kOutcomePrefix = "OUTCOME_";

}  // namespace

std::string JobStateName(wire::JobState state) {
  const std::string& name = wire::JobState_Name(state);
  if (state == wire::JOB_STATE_UNSPECIFIED || name.rfind(kJobPrefix, 0) != 0) return "UNKNOWN";
  return name.substr(kJobPrefix.size());
}

std::string OutcomeName(wire::Outcome outcome) {
  if (outcome == wire::OUTCOME_UNSPECIFIED) return "";
  std::string name = wire::Outcome_Name(outcome);
  if (name.rfind(kOutcomePrefix, 0) != 0) return "unknown";
  name.erase(0, kOutcomePrefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

wire::Outcome OutcomeFromName(std::string_view name) {
  std::string value(kOutcomePrefix);
  for (char c : name) value += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  wire::Outcome outcome = wire::OUTCOME_UNSPECIFIED;
  // Only the lower-case names OutcomeName gives map back ("FAILED" is not a name).
  if (!wire::Outcome_Parse(value, &outcome) || OutcomeName(outcome) != name) return wire::OUTCOME_UNSPECIFIED;
  return outcome;
}

std::string DescribeEnd(wire::Outcome end, const std::string& reason) {
  const std::string name = OutcomeName(end);
  return name.empty() || reason.empty() ? name : name + ": " + reason;
}

}  // namespace trainyard
