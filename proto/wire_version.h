// The protocol version every wire::Envelope carries (trainyard.proto). The coordinator
// answers an envelope of another version with an error naming both versions.
#pragma once

#include <cstdint>

namespace trainyard {

inline constexpr uint32_t kProtocolVersion = 1;

}  // namespace trainyard
