#include "common/safetensors.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/hash.h"

namespace trainyard {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void Fail(const std::string& path, const std::string& message) {
  throw SafetensorsError(path + ": invalid safetensors: " + message);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

TensorRecord ParseRecord(const std::string& path, const std::string& name, const nlohmann::json& entry,
                         size_t data_size) {
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
    Fail(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
  TensorRecord r;
  try {
    r.dtype = entry["dtype"].get<std::string>();
    r.shape = entry["shape"].get<std::vector<int64_t>>();
    auto offsets = entry["data_offsets"].get<std::vector<uint64_t>>();
    if (offsets.size() != 2) Fail(path, "tensor '" + name + "': data_offsets must have 2 entries");
    r.begin = offsets[0];
    r.end = offsets[1];
  } catch (const nlohmann::json::exception& e) {
    Fail(path, "tensor '" + name + "': " + e.what());
  }
  if (DtypeSize(r.dtype) == 0) Fail(path, "tensor '" + name + "': unknown dtype " + r.dtype);
  // The byte count must not wrap: [2^32, 2^32] F32 would otherwise "need" 0 bytes.
  uint64_t expected = DtypeSize(r.dtype);
  for (int64_t d : r.shape) {
    if (d < 0) Fail(path, "tensor '" + name + "': negative dimension in shape " + ShapeText(r.shape));
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected))
      Fail(path, "tensor '" + name + "': shape " + ShapeText(r.shape) + " overflows 64 bits of bytes");
  }
  if (r.begin > r.end || r.end - r.begin != expected)
    Fail(path, "tensor '" + name + "': shape " + ShapeText(r.shape) + " " + r.dtype + " needs " +
                   std::to_string(expected) + " bytes but data_offsets span " +
                   std::to_string(r.end >= r.begin ? r.end - r.begin : 0));
  if (r.end > data_size)
    Fail(path, "tensor '" + name + "' ends at byte " + std::to_string(r.end) + " but the data section has only " +
                   std::to_string(data_size) + " bytes (truncated file?)");
  return r;
}

std::string HexOf(uint32_t value) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(8, '0');
  for (int i = 7; i >= 0; --i, value >>= 4) out[static_cast<size_t>(i)] = kDigits[value & 0xF];
  return out;
}

void VerifyChecksum(const std::string& path, const std::string& stored, const uint8_t* data, size_t size) {
  if (stored.size() != 8 || stored.find_first_not_of("0123456789abcdef") != std::string::npos)
    Fail(path, std::string(kDataChecksumKey) + " '" + stored.substr(0, 40) + "' is not 8 lowercase hex digits");
  const std::string computed = HexOf(Crc32c(data, size));
  if (computed != stored)
    Fail(path, "the tensor data do not match their checksum (" + std::string(kDataChecksumKey) + " " + stored +
                   ", computed " + computed + "): the file is corrupt");
}

}  // namespace

size_t DtypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

SafetensorsFile SafetensorsFile::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SafetensorsError(path + ": cannot open");
  return Parse(std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), path);
}

SafetensorsFile SafetensorsFile::Parse(std::vector<uint8_t> bytes, const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.data_ = std::move(bytes);
  if (file.data_.size() < 8) Fail(path, "shorter than the 8-byte header size");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | file.data_[i];
  if (header_size > kMaxHeaderBytes || 8 + header_size > file.data_.size())
    Fail(path, "header size " + std::to_string(header_size) + " exceeds the file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.data_.begin() + 8, file.data_.begin() + 8 + header_size);
  } catch (const nlohmann::json::parse_error& e) {
    Fail(path, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) Fail(path, "header is not a JSON object");
  file.data_offset_ = 8 + header_size;
  const size_t data_size = file.data_.size() - file.data_offset_;
  size_t data_end = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) Fail(path, "__metadata__ is not a JSON object");
      for (const auto& [k, v] : entry.items())
        if (v.is_string()) file.metadata_[k] = v.get<std::string>();
      continue;
    }
    file.tensors_[name] = ParseRecord(path, name, entry, data_size);
    data_end = std::max(data_end, file.tensors_[name].end);
  }
  if (data_end != data_size)
    Fail(path,
         "data section holds " + std::to_string(data_size) + " bytes but the tensors span " + std::to_string(data_end));
  if (auto it = file.metadata_.find(kDataChecksumKey); it != file.metadata_.end())
    VerifyChecksum(path, it->second, file.data_.data() + file.data_offset_, data_size);
  return file;
}

void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  uint32_t crc = 0;
  for (const auto& t : tensors) {
    size_t bytes = DtypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<size_t>(d);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    crc = Crc32c(t.data, bytes, crc);
  }
  std::map<std::string, std::string> all_metadata = metadata;
  all_metadata[kDataChecksumKey] = HexOf(crc);
  header["__metadata__"] = all_metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t size_bytes[8];
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<uint8_t>((uint64_t(text.size()) >> (8 * i)) & 0xFF);
  AtomicFileWriter writer(path);
  writer.Write(size_bytes, 8);
  writer.Write(text);
  for (const auto& t : tensors) {
    size_t bytes = DtypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<size_t>(d);
    writer.Write(t.data, bytes);
  }
  writer.Commit();
}

}  // namespace trainyard
