// libFuzzer target: YAML text -> ParseJobSpec, or ParseSearchSpec for a kind: search
// file (the coordinator's choice too). Every input must end in a spec or a SpecError; any
// other exception escapes, and libFuzzer reports it as a crash. A job file is parsed as
// a standalone worker reads one: ${VAR} expanded, and each comment line "#set K=V" given
// as `--set K=V`.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/spec/job_spec.h"
#include "common/spec/search_spec.h"
#include "tests/fuzz/fuzz_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  try {
    if (trainyard::IsSearchFile(yaml)) {
      const trainyard::SearchSpec search =
          trainyard::ParseSearchSpec(yaml, "fuzz.yaml", trainyard::fuzz::ScratchFolder());
      // Every trial that was built is a job that parsed, under the search's name.
      for (const auto& trial : search.trials)
        if (trial.spec.name.rfind(search.name + ".t", 0) != 0) __builtin_trap();
      return 0;
    }
    trainyard::SpecOverrides overrides;
    overrides.expand_environment = true;
    for (size_t at = yaml.find("#set "); at != std::string::npos; at = yaml.find("#set ", at + 1))
      if (at == 0 || yaml[at - 1] == '\n') overrides.AddAssignment(yaml.substr(at + 5, yaml.find('\n', at) - at - 5));
    trainyard::JobSpec spec = trainyard::ParseJobSpec(yaml, "fuzz.yaml", trainyard::fuzz::ScratchFolder(), overrides);
    // A spec that parsed must be usable: every key it read can be located.
    for (const auto& [key, where] : spec.locations) (void)spec.Where(key);
  } catch (const trainyard::SpecError&) {
  }
  return 0;
}
