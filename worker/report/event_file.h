// TensorBoard event files, written without TensorFlow.
//
// An event file is a sequence of records in TFRecord framing:
//   uint64  length of the payload, little-endian
//   uint32  masked CRC32C of those 8 length bytes
//   bytes   the payload: one serialized tensorboard.Event (tensorboard_event.proto)
//   uint32  masked CRC32C of the payload
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a CRC stored
// inside CRC'd data does not checksum to a constant. The first event of a file carries
// file_version "brain.Event:2"; each later one a step, a wall time and a Summary of
// scalar values. Readers take every file named *tfevents* in a folder, in name order;
// the name starts with the creation time, so a resumed run's new file sorts after the
// old one, and TensorBoard drops the old file's events past the step it resumed from
// (steps must never decrease within a file for that to work).
//
// This header carries no protobuf types: the worker's torch-free report code includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace trainyard {

// TFRecord's masked CRC32C of `size` bytes.
uint32_t MaskedCrc32c(const void* data, size_t size);

class EventFileWriter {
 public:
  // Creates `dir` if needed and a new file events.out.tfevents.<seconds>.<host>.<pid>
  // in it holding the file-version event. Throws std::runtime_error naming the path if
  // it cannot be created.
  explicit EventFileWriter(const std::string& dir);

  // One event at `step` with every (tag, value) as a scalar. Steps must not decrease
  // from one call to the next. Throws std::runtime_error if the write fails.
  void AddScalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, float>>& scalars);
  // Hands what was written to the OS, so a reader (or a crash) sees it.
  void Flush();
  const std::string& path() const { return path_; }

 private:
  void WriteRecord(const std::string& payload);

  std::string path_;
  std::ofstream out_;
};

}  // namespace trainyard
