#include "proto/wire_names.h"

#include <array>
#include <utility>

namespace trainyard {
namespace {

constexpr std::array<std::pair<wire::Outcome, const char*>, 7> kOutcomeNames = {{
    {wire::OUTCOME_SUCCEEDED, "succeeded"},
    {wire::OUTCOME_FAILED, "failed"},
    {wire::OUTCOME_BAD_INPUT, "bad_input"},
    {wire::OUTCOME_CANCELLED, "cancelled"},
    {wire::OUTCOME_RELEASED, "released"},
    {wire::OUTCOME_INTERRUPTED, "interrupted"},
    {wire::OUTCOME_ABANDONED, "abandoned"},
}};

}  // namespace

const char* JobStateName(wire::JobState state) {
  switch (state) {
    case wire::JOB_QUEUED:
      return "QUEUED";
    case wire::JOB_RUNNING:
      return "RUNNING";
    case wire::JOB_SUCCEEDED:
      return "SUCCEEDED";
    case wire::JOB_FAILED:
      return "FAILED";
    case wire::JOB_CANCELLED:
      return "CANCELLED";
    default:
      return "UNKNOWN";
  }
}

const char* OutcomeName(wire::Outcome outcome) {
  if (outcome == wire::OUTCOME_UNSPECIFIED) return "";
  for (const auto& [value, name] : kOutcomeNames)
    if (value == outcome) return name;
  return "unknown";
}

wire::Outcome OutcomeFromName(std::string_view name) {
  for (const auto& [value, text] : kOutcomeNames)
    if (name == text) return value;
  return wire::OUTCOME_UNSPECIFIED;
}

}  // namespace trainyard
