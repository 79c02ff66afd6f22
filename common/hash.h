// Checksums of bytes. Neither is for security.
//   FNV-1a, 64 bits: a stable fingerprint of small inputs (job files in benchmark
//     reports, parameters in cross-rank consistency checks).
//   CRC32C (Castagnoli): an error-detecting code for large data (the tensor data of
//     safetensors files); it catches every burst of up to 32 flipped bits and any odd
//     number of flips, and misses other damage with probability 2^-32.
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

// Folds `size` bytes into a CRC32C; start from 0, or chain calls:
// Crc32c(b, nb, Crc32c(a, na)) == Crc32c(a + b). Portable (no CPU extension); a few
// GB/s, table-driven eight bytes at a time.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace trainyard
