#include "common/log.h"

#include <spdlog/spdlog.h>

#include <cstdarg>
#include <mutex>
#include <vector>

namespace trainyard {
namespace {

std::mutex last_line_mutex;
std::string last_line;

void Remember(const std::string& message) {
  std::lock_guard<std::mutex> lock(last_line_mutex);
  last_line = message.substr(0, 400);
}

}  // namespace

std::string LastLogLine() {
  std::lock_guard<std::mutex> lock(last_line_mutex);
  return last_line;
}

void RememberLogLine(const std::string& line) { Remember(line); }

void LogSetup(const std::string& level) {
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("[%H:%M:%S] %v");
}

void LogDebug(const std::string& message) { spdlog::debug("{}", message); }
void LogInfo(const std::string& message) {
  Remember(message);
  spdlog::info("{}", message);
}
void LogWarn(const std::string& message) {
  Remember("warning: " + message);
  spdlog::warn("warning: {}", message);
}
void LogError(const std::string& message) {
  Remember("error: " + message);
  spdlog::error("error: {}", message);
}

std::string StrFormat(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  int size = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::vector<char> buffer(static_cast<size_t>(size > 0 ? size : 0) + 1);
  std::vsnprintf(buffer.data(), buffer.size(), format, args);
  va_end(args);
  return std::string(buffer.data(), static_cast<size_t>(size > 0 ? size : 0));
}

}  // namespace trainyard
