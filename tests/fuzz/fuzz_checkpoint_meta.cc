// libFuzzer target: bytes -> a checkpoint's header and metadata, as a resume reads them
// before any tensor (SafetensorsFile::Parse, then ParseCheckpointMeta). An input that
// starts with 'M' is a metadata map itself, one "key=value" a line, so the fuzzer also
// reaches the field checks without first building a valid safetensors image. Every
// input must end in a CheckpointMeta or a SafetensorsError/CheckpointError.
#include <cstddef>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/checkpoint_meta.h"
#include "common/safetensors.h"

namespace {

std::map<std::string, std::string> MetadataLines(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> meta;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(in, line);) {
    const size_t equals = line.find('=');
    if (equals != std::string::npos) meta[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return meta;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    if (size > 0 && data[0] == 'M') {
      trainyard::ParseCheckpointMeta(MetadataLines(data + 1, size - 1), "fuzz.meta");
    } else {
      trainyard::SafetensorsFile file =
          trainyard::SafetensorsFile::Parse(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
      trainyard::ParseCheckpointMeta(file.metadata(), "fuzz.safetensors");
    }
  } catch (const trainyard::SafetensorsError&) {
  } catch (const trainyard::CheckpointError&) {
  }
  return 0;
}
