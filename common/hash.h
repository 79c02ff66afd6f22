// FNV-1a, 64 bits: a fast, stable fingerprint of bytes (job files in benchmark reports,
// parameters in cross-rank consistency checks). Not for security.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trainyard {

inline constexpr uint64_t kFnv1aOffset = 14695981039346656037ULL;

// Folds `size` bytes into `hash`; start from kFnv1aOffset, or chain calls.
inline uint64_t Fnv1a(const void* data, size_t size, uint64_t hash = kFnv1aOffset) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  return hash;
}

}  // namespace trainyard
