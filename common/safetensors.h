// The safetensors file format (Hugging Face): an 8-byte little-endian header size, a
// JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then
// the raw little-endian tensor bytes. This module is libtorch-free; see
// hf_checkpoint.h for the conversion to and from torch tensors.
//
// Files written here carry a CRC32C of their whole data section as the metadata value
// kDataChecksumKey (8 lowercase hex digits); a file that has the key is verified on
// read. Other writers' files (Hugging Face downloads) have no key and are read as they
// are. Other tools ignore metadata they do not know, so the files stay plain safetensors.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainyard {

// A file that is not valid safetensors; what() names the file and the lie it tells.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorRecord {
  std::string dtype;  // "F32", "F16", "BF16", "I64", "I32", "U8", ...
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte range inside the data section
};

inline constexpr char kDataChecksumKey[] = "data_crc32c";

// Bytes per element of a safetensors dtype; 0 if unknown.
size_t DtypeSize(const std::string& dtype);

class SafetensorsFile {
 public:
  // Reads and validates the whole file: the header must parse, every dtype be known,
  // every byte range match its shape, the ranges tile the data section from byte 0
  // without gaps or overlaps, the data section end exactly where the last tensor does
  // (which catches truncation), and the data match its kDataChecksumKey when the file
  // has one (which catches flipped bits).
  static SafetensorsFile Read(const std::string& path);
  // The same checks on bytes already in memory; `name` stands for the file in messages.
  // Any input ends in a SafetensorsFile or a SafetensorsError (tests/fuzz/fuzz_safetensors).
  static SafetensorsFile Parse(std::vector<uint8_t> bytes, const std::string& name);

  const std::map<std::string, TensorRecord>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const uint8_t* Data(const TensorRecord& record) const { return data_.data() + data_offset_ + record.begin; }
  const std::string& path() const { return path_; }
  // Whether the data section was verified against a stored checksum.
  bool checksummed() const { return metadata_.count(kDataChecksumKey) != 0; }

 private:
  std::string path_;
  std::vector<uint8_t> data_;
  size_t data_offset_ = 0;
  std::map<std::string, TensorRecord> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // contiguous little-endian bytes, DtypeSize(dtype) * numel
};

// Writes a safetensors file atomically (temporary file, fsync, rename), with the data
// section's checksum added to `metadata` as kDataChecksumKey.
void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata);

}  // namespace trainyard
