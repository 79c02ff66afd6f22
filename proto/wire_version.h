// The protocol version every wire::Envelope carries (trainyard.proto). The coordinator
// answers an envelope of another version with an error naming both versions.
#pragma once

#include <cstdint>

namespace trainyard {

// 2: rank and world tokens (Register), required on every worker message.
inline constexpr uint32_t kProtocolVersion = 2;

}  // namespace trainyard
