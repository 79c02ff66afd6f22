#include "worker/report/event_file.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/hash.h"
#include "tensorboard_event.pb.h"

namespace trainyard {
namespace {

constexpr uint32_t kCrcMaskDelta = 0xa282ead8u;

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

void PutLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create " + dir + ": " + error.message());
  const double now = NowSeconds();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + HostName() + "." +
          std::to_string(::getpid());
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot create " + path_ + ": " + std::strerror(errno));
  tensorboard::Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  WriteRecord(event.SerializeAsString());
  Flush();
}

void EventFileWriter::AddScalars(int64_t step, double wall_time,
                                 const std::vector<std::pair<std::string, float>>& scalars) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tensorboard::Summary::Value* entry = summary->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(value);
  }
  WriteRecord(event.SerializeAsString());
}

void EventFileWriter::Flush() {
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
}

void EventFileWriter::WriteRecord(const std::string& payload) {
  std::string record;
  record.reserve(payload.size() + 16);
  PutLittleEndian(payload.size(), 8, &record);
  PutLittleEndian(MaskedCrc32c(record.data(), 8), 4, &record);
  record += payload;
  PutLittleEndian(MaskedCrc32c(payload.data(), payload.size()), 4, &record);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  if (!out_) throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
}

}  // namespace trainyard
