#include "worker/models/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/atomic_file.h"
#include "common/safetensors.h"

namespace trainyard {
namespace {

const std::map<std::string, torch::ScalarType>& DtypeTable() {
  static const std::map<std::string, torch::ScalarType> table = {
      {"F64", torch::kDouble}, {"F32", torch::kFloat}, {"F16", torch::kHalf},  {"BF16", torch::kBFloat16},
      {"I64", torch::kLong},   {"I32", torch::kInt},   {"I16", torch::kShort}, {"I8", torch::kChar},
      {"U8", torch::kByte},    {"BOOL", torch::kBool}};
  return table;
}

std::string DtypeName(torch::ScalarType type) {
  for (const auto& [name, t] : DtypeTable())
    if (t == type) return name;
  throw std::runtime_error(std::string("safetensors cannot hold dtype ") + c10::toString(type));
}

}  // namespace

std::map<std::string, torch::Tensor> LoadSafetensors(const std::string& path,
                                                     std::map<std::string, std::string>* metadata) {
  SafetensorsFile file = SafetensorsFile::Read(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, record] : file.tensors()) {
    auto options = torch::TensorOptions().dtype(DtypeTable().at(record.dtype));
    out[name] = torch::from_blob(const_cast<uint8_t*>(file.Data(record)), record.shape, options).clone();
  }
  if (metadata) *metadata = file.metadata();
  return out;
}

void SaveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep_alive;
  std::vector<TensorToWrite> records;
  for (const auto& [name, tensor] : tensors) {
    keep_alive.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& t = keep_alive.back();
    records.push_back(
        {name, DtypeName(t.scalar_type()), std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr()});
  }
  WriteSafetensors(path, records, metadata);
}

nlohmann::json ReadHfConfig(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / "config.json").string();
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  try {
    nlohmann::json config = nlohmann::json::parse(in);
    if (!config.is_object()) throw std::runtime_error("expected a JSON object");
    return config;
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

namespace {

bool StartsWithAny(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& prefix : prefixes)
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

std::vector<std::string> LoadHfWeights(const std::string& folder, ModelImpl& model) {
  const std::string path = (std::filesystem::path(folder) / "model.safetensors").string();
  auto tensors = LoadSafetensors(path, nullptr);
  const HfNaming naming = model.naming();
  std::vector<std::string> kept_fresh;
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    auto it = tensors.find(name);
    const std::string& prefix = naming.base_prefix;
    if (it == tensors.end() && !prefix.empty() && name.rfind(prefix, 0) == 0)
      it = tensors.find(name.substr(prefix.size()));
    const bool is_head = StartsWithAny(name, naming.head_prefixes);
    if (is_head && (it == tensors.end() || it->second.sizes() != item.value().sizes())) {
      kept_fresh.push_back(name);
      continue;
    }
    if (it == tensors.end()) throw std::runtime_error(path + ": missing tensor '" + name + "'");
    if (it->second.sizes() != item.value().sizes())
      throw std::runtime_error(path + ": tensor '" + name + "' has shape " + c10::str(it->second.sizes()) +
                               ", the model expects " + c10::str(item.value().sizes()));
    item.value().copy_(it->second);
  }
  return kept_fresh;
}

void SaveHfModel(const std::string& folder, ModelImpl& model) {
  std::filesystem::create_directories(folder);
  NamedTensors tensors;
  for (const auto& item : model.named_parameters()) tensors.emplace_back(item.key(), item.value());
  SaveSafetensors((std::filesystem::path(folder) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  WriteFileAtomically((std::filesystem::path(folder) / "config.json").string(), model.HfConfig().dump(2) + "\n");
}

}  // namespace trainyard
