// The protocol version every wire::Envelope carries (trainyard.proto). The coordinator
// answers an envelope of another version with an error naming both versions.
#pragma once

#include <cstdint>

namespace trainyard {

// 2: rank and world tokens (Register), required on every worker message.
// 3: a job runs as its own mpirun; its lead agent's result speaks for the gang.
// 4: agents are independent processes; Assign places each job rank on a slot of any
//    agent (JobPlace), and RankInfo names the slot's index on its host.
// 5: job states and outcomes are enums (JobState, Outcome), no longer strings.
// 6: the coordinator pulses no rank; agents watch their link with ZMTP heartbeats.
// 7: elastic replicas join, beat and vote on steps (Note [Step quorum]).
inline constexpr uint32_t kProtocolVersion = 7;

}  // namespace trainyard
