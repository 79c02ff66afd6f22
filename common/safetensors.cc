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

// The shape's dimensions, each a non-negative JSON integer (a float or a huge value
// would not convert safely).
std::vector<int64_t> ParseShape(const std::string& path, const std::string& name, const nlohmann::json& shape) {
  if (!shape.is_array()) Fail(path, "tensor '" + name + "': shape must be an array of integers");
  std::vector<int64_t> dims;
  for (const nlohmann::json& d : shape) {
    if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t(INT64_MAX)))
      Fail(path,
           "tensor '" + name + "': shape must hold integers; dimension " + std::to_string(dims.size()) + " is not one");
    dims.push_back(d.get<int64_t>());
    if (dims.back() < 0) Fail(path, "tensor '" + name + "': negative dimension in shape " + ShapeText(dims));
  }
  return dims;
}

// Bytes a tensor of `shape` and `dtype` takes; a SafetensorsError if that overflows 64 bits.
uint64_t ByteSize(const std::string& path, const std::string& name, const std::vector<int64_t>& shape,
                  const std::string& dtype) {
  uint64_t bytes = DtypeSize(dtype);
  for (int64_t d : shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
      Fail(path, "tensor '" + name + "': shape " + ShapeText(shape) + " is too large");
  return bytes;
}

TensorRecord ParseRecord(const std::string& path, const std::string& name, const nlohmann::json& entry,
                         size_t data_size) {
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
    Fail(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
  TensorRecord r;
  const nlohmann::json& dtype = entry.at("dtype");
  const nlohmann::json& offsets = entry.at("data_offsets");
  if (!dtype.is_string()) Fail(path, "tensor '" + name + "': dtype must be a string");
  r.dtype = dtype.get<std::string>();
  if (DtypeSize(r.dtype) == 0) Fail(path, "tensor '" + name + "': unknown dtype " + r.dtype);
  r.shape = ParseShape(path, name, entry.at("shape"));
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    Fail(path, "tensor '" + name + "': data_offsets must be 2 non-negative integers");
  r.begin = offsets[0].get<uint64_t>();
  r.end = offsets[1].get<uint64_t>();
  const uint64_t expected = ByteSize(path, name, r.shape, r.dtype);
  if (r.begin > r.end || r.end - r.begin != expected)
    Fail(path, "tensor '" + name + "': shape " + ShapeText(r.shape) + " " + r.dtype + " needs " +
                   std::to_string(expected) + " bytes but data_offsets span " +
                   std::to_string(r.end >= r.begin ? r.end - r.begin : 0));
  if (r.end > data_size)
    Fail(path, "tensor '" + name + "' ends at byte " + std::to_string(r.end) + " but the data section has only " +
                   std::to_string(data_size) + " bytes (truncated file?)");
  return r;
}

std::map<std::string, std::string> ParseMetadata(const std::string& path, const nlohmann::json& entry) {
  if (!entry.is_object()) Fail(path, "__metadata__ must be an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : entry.items()) {
    if (!value.is_string()) Fail(path, "__metadata__ value of '" + key + "' is not a string");
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

// As Hugging Face's reader requires: in offset order, each tensor starts where the one
// before ends, from byte 0 to the end of the data section, so no byte is shared or
// left out.
void CheckTiling(const std::string& path, const std::map<std::string, TensorRecord>& tensors, size_t data_size) {
  std::vector<std::pair<size_t, size_t>> ranges;
  ranges.reserve(tensors.size());
  for (const auto& [name, r] : tensors) ranges.emplace_back(r.begin, r.end);
  std::sort(ranges.begin(), ranges.end());
  size_t end = 0;
  for (const auto& [begin, stop] : ranges) {
    if (begin != end)
      Fail(path, "tensor data " + std::string(begin < end ? "overlaps" : "leaves a gap") + " at byte " +
                     std::to_string(std::min(begin, end)));
    end = stop;
  }
  if (end != data_size)
    Fail(path,
         "data section holds " + std::to_string(data_size) + " bytes but the tensors span " + std::to_string(end));
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

SafetensorsFile SafetensorsFile::Parse(std::vector<uint8_t> bytes, const std::string& name) {
  SafetensorsFile file;
  file.path_ = name;
  file.data_ = std::move(bytes);
  if (file.data_.size() < 8) Fail(name, "shorter than the 8-byte header size");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | file.data_[i];
  if (header_size > kMaxHeaderBytes || 8 + header_size > file.data_.size())
    Fail(name, "header size " + std::to_string(header_size) + " exceeds the file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.data_.begin() + 8, file.data_.begin() + 8 + header_size);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    Fail(name, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) Fail(name, "header is not a JSON object");
  file.data_offset_ = 8 + header_size;
  const size_t data_size = file.data_.size() - file.data_offset_;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__")
      file.metadata_ = ParseMetadata(name, entry);
    else
      file.tensors_[key] = ParseRecord(name, key, entry, data_size);
  }
  CheckTiling(name, file.tensors_, data_size);
  if (auto it = file.metadata_.find(kDataChecksumKey); it != file.metadata_.end())
    VerifyChecksum(name, it->second, file.data_.data() + file.data_offset_, data_size);
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
