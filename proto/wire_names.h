// The names people, logs and the coordinator's store use for the wire's enums
// (trainyard.proto), derived from the enum values' own names: job states in capitals
// without the JOB_ prefix (QUEUED ... CANCELLED), outcomes in lower case without the
// OUTCOME_ prefix (succeeded, failed, bad_input, cancelled, released, interrupted,
// abandoned).
#pragma once

#include <string>
#include <string_view>

#include "trainyard.pb.h"

namespace trainyard {

// "UNKNOWN" for a number this build does not know (a newer peer's).
std::string JobStateName(wire::JobState state);
// "" for OUTCOME_UNSPECIFIED (an attempt still running); "unknown" for a number this
// build does not know.
std::string OutcomeName(wire::Outcome outcome);
// The outcome named `name`; OUTCOME_UNSPECIFIED for any other text.
wire::Outcome OutcomeFromName(std::string_view name);
// An ended attempt as people read it: "succeeded", "failed: <reason>"; "" while it runs.
std::string DescribeEnd(wire::Outcome end, const std::string& reason);

}  // namespace trainyard
