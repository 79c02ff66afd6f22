// The names people, logs and the coordinator's store use for the wire's enums
// (trainyard.proto): job states in capitals (QUEUED ... CANCELLED), outcomes in lower
// case (succeeded, failed, bad_input, cancelled, released, interrupted, abandoned).
#pragma once

#include <string_view>

#include "trainyard.pb.h"

namespace trainyard {

// "UNKNOWN" for a number this build does not know (a newer peer's).
const char* JobStateName(wire::JobState state);
// "" for OUTCOME_UNSPECIFIED (an attempt still running); "unknown" for a number this
// build does not know.
const char* OutcomeName(wire::Outcome outcome);
// The outcome named `name`; OUTCOME_UNSPECIFIED for any other text.
wire::Outcome OutcomeFromName(std::string_view name);

}  // namespace trainyard
