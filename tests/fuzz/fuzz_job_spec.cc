// libFuzzer target: YAML text -> ParseJobSpec. Every input must end in a JobSpec or a
// SpecError; any other exception escapes, and libFuzzer reports it as a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/spec/job_spec.h"
#include "tests/fuzz/fuzz_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  try {
    trainyard::JobSpec spec = trainyard::ParseJobSpec(yaml, "fuzz.yaml", trainyard::fuzz::ScratchFolder());
    // A spec that parsed must be usable: every key it read can be located.
    for (const auto& [key, where] : spec.locations) (void)spec.Where(key);
  } catch (const trainyard::SpecError&) {
  }
  return 0;
}
