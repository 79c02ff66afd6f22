#include "worker/compiled/aoti_package.h"

#include <ATen/Version.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/version.h>

#include <cctype>
#include <filesystem>
#include <stdexcept>

namespace trainyard {
namespace {

// The first line of an exception's message, without libtorch's C++ backtrace.
std::string Reason(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  return what.substr(0, std::min(what.find('\n'), size_t(300)));
}

std::string Get(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? std::string() : it->second;
}

// 0 = plain, 1 = AVX2, 2 = AVX-512: Inductor's ISA names ("avx512", "amx", "avx2") and
// ATen's CPU capability ("AVX512", "AVX2", "DEFAULT"; ATEN_CPU_CAPABILITY can lower it).
int IsaLevel(std::string isa) {
  for (char& c : isa) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (isa.rfind("avx512", 0) == 0 || isa == "amx") return 2;
  if (isa == "avx2") return 1;
  return 0;
}

}  // namespace

std::string VectorIsaProblem(const std::string& package_isa) {
  const int have = IsaLevel(at::get_cpu_capability());
  const int need = IsaLevel(package_isa);
  if (need <= have) return "";
  const char* names[] = {"no vector extensions", "AVX2", "AVX-512"};
  return "the package was compiled for " + package_isa + " instructions and this CPU (as ATen sees it) has " +
         names[std::min(have, 2)] + "; export it again on a machine like this one";
}

AotiPackage::AotiPackage(const std::string& path, torch::Device device) {
  if (!std::filesystem::is_regular_file(path)) throw std::invalid_argument(path + ": no such file");
  std::unordered_map<std::string, std::string> meta;
  try {
    meta = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
  } catch (const std::exception& e) {
    throw std::invalid_argument(path + ": not an AOTInductor package (" + Reason(e) + ")");
  }
  metadata_ = std::map<std::string, std::string>(meta.begin(), meta.end());
  const std::string made_by = Get(metadata_, "trainyard_torch_version");
  if (made_by.empty())
    throw std::invalid_argument(path + ": the package has no trainyard metadata; make it with scripts/export_aoti.py");
  const std::string ours = std::string(TORCH_VERSION).substr(0, std::string(TORCH_VERSION).find('+'));
  if (made_by != ours)
    throw std::invalid_argument(path + ": the package was compiled by torch " + made_by +
                                " and this worker runs torch " + ours +
                                "; AOTInductor packages only load in the version that made them");
  const std::string made_for = Get(metadata_, "trainyard_device");
  if (made_for != torch::Device(device.type()).str())
    throw std::invalid_argument(path + ": the package was compiled for " + made_for + " and this job runs on " +
                                device.str());
  if (device.is_cpu())
    if (std::string problem = VectorIsaProblem(Get(metadata_, "trainyard_vec_isa")); !problem.empty())
      throw std::invalid_argument(path + ": " + problem);
  try {
    max_batch_ = std::stoll(Get(metadata_, "trainyard_max_batch"));
    max_seq_ = std::stoll(Get(metadata_, "trainyard_max_seq"));
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path, "model", /*run_single_threaded=*/false, /*num_runners=*/1,
        device.is_cuda() ? device.index() : c10::DeviceIndex(-1));
  } catch (const std::exception& e) {
    throw std::invalid_argument(path + ": cannot load the package: " + Reason(e));
  }
}

AotiPackage::~AotiPackage() = default;

torch::Tensor AotiPackage::Forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  if (input_ids.size(0) > max_batch_ || input_ids.size(1) > max_seq_)
    throw std::invalid_argument("a batch of " + std::to_string(input_ids.size(0)) + " x " +
                                std::to_string(input_ids.size(1)) + " tokens is beyond the package's " +
                                std::to_string(max_batch_) + " x " + std::to_string(max_seq_));
  return loader_->run({input_ids.contiguous(), attention_mask.contiguous()}).at(0);
}

std::string AotiPackage::Describe() const {
  return "batch 1.." + std::to_string(max_batch_) + ", seq 1.." + std::to_string(max_seq_) + ", " +
         Get(metadata_, "trainyard_device") + ", vector ISA " + Get(metadata_, "trainyard_vec_isa") + ", torch " +
         Get(metadata_, "trainyard_torch_version");
}

}  // namespace trainyard
