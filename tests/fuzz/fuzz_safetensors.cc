// libFuzzer target: bytes -> SafetensorsFile::Parse. Every input must end in a parsed
// file or a SafetensorsError, and every byte range of a parsed file must lie inside
// the buffer (touched here, so AddressSanitizer checks it).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    trainyard::SafetensorsFile file =
        trainyard::SafetensorsFile::Parse(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (const auto& [name, record] : file.tensors()) {
      if (record.end == record.begin) continue;
      sink = sink ^ file.Data(record)[0] ^ file.Data(record)[record.end - record.begin - 1];
    }
  } catch (const trainyard::SafetensorsError&) {
  }
  return 0;
}
