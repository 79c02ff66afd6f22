#include "worker/jobs/forward_modes.h"

#include <stdexcept>

#include "common/log.h"
#include "worker/jobs/job_setup.h"
#include "worker/models/quantize.h"

namespace trainyard {

std::unique_ptr<AotiPackage> OpenAotiPackage(const JobSpec& spec, const std::string& key, const std::string& path,
                                             const torch::Device& device) {
  std::unique_ptr<AotiPackage> package;
  try {
    package = std::make_unique<AotiPackage>(path, device);
  } catch (const std::invalid_argument& e) {
    throw InputError(spec.Where(key) + ": " + e.what());
  }
  LogInfo("aoti: " + path + " (" + package->Describe() + ")");
  return package;
}

void QuantizeForInt8(const JobSpec& spec, const std::string& key, ModelImpl& model, const torch::Device& device) {
  if (!device.is_cpu()) throw InputError(spec.Where(key) + ": int8 runs on the CPU; this job runs on " + device.str());
  const Int8Summary q = QuantizeLinearsInt8(model);
  LogInfo(StrFormat("int8: %d Linear layers quantized (%.1f MB of fp32 weights as %.1f MB of int8)", q.layers,
                    q.fp32_mb, q.int8_mb));
}

}  // namespace trainyard
