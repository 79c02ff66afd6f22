// An AOTInductor package (.pt2, made by scripts/export_aoti.py from a Hugging Face
// classifier folder): the `aoti` mode of benchmark and inference jobs. The package is
// the model compiled ahead of time by torch.export + Inductor into a shared library with
// its weights; libtorch's AOTIModelPackageLoader unpacks it and runs it from C++, with no
// Python.
//
// A compiled package is tied to the torch version that made it and, on CPU, to the vector
// instructions it was compiled for. Load() checks the metadata export_aoti.py records
// before loading the library, so a package from elsewhere is refused with a message
// instead of failing to link or dying of SIGILL.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace trainyard {

class AotiPackage {
 public:
  // Throws std::invalid_argument, naming the cause, when the file is missing or not a
  // package, was made by another torch version, for another device type, or for vector
  // instructions this CPU lacks.
  AotiPackage(const std::string& path, torch::Device device);
  ~AotiPackage();
  AotiPackage(const AotiPackage&) = delete;
  AotiPackage& operator=(const AotiPackage&) = delete;

  // logits [B, labels] for int64 input_ids and attention_mask [B, S] on the device.
  torch::Tensor Forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask);

  int64_t max_batch() const { return max_batch_; }
  int64_t max_seq() const { return max_seq_; }
  // One line for logs: what the package was compiled for.
  std::string Describe() const;

 private:
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  std::map<std::string, std::string> metadata_;
  int64_t max_batch_ = 0, max_seq_ = 0;
};

// Why a package compiled for `package_isa` ("avx512", "avx2", "none", ... as Inductor names
// them) cannot run on this CPU, or "" when it can.
std::string VectorIsaProblem(const std::string& package_isa);

}  // namespace trainyard
