// The forward modes other than eager that more than one job kind runs (ForwardMode in
// job_spec.h): an AOTInductor package, and a model with int8 Linear layers. Problems
// become InputError located at the job-file key that asked for the mode.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "common/spec/job_spec.h"
#include "worker/compiled/aoti_package.h"
#include "worker/models/model.h"

namespace trainyard {

// Loads the package at `path` (named by `key`) onto `device` and logs what it holds.
std::unique_ptr<AotiPackage> OpenAotiPackage(const JobSpec& spec, const std::string& key, const std::string& path,
                                             const torch::Device& device);

// Replaces `model`'s Linear layers by dynamic int8 ones (CPU only; `key` asked for it)
// and logs what was quantized.
void QuantizeForInt8(const JobSpec& spec, const std::string& key, ModelImpl& model, const torch::Device& device);

}  // namespace trainyard
