// Logging for the worker. libtorch ships its own {fmt} headers, which clash with the
// {fmt} that Debian's spdlog is built against, so code that sees torch headers logs
// through these functions (implemented in a torch-free file) and formats with
// StrFormat (printf-style) instead of including spdlog.
#pragma once

#include <string>

namespace trainyard {

void LogSetup(const std::string& level);  // trace, debug, info, warn, error
void LogDebug(const std::string& message);
void LogInfo(const std::string& message);
void LogWarn(const std::string& message);
void LogError(const std::string& message);
// The latest message logged at info level or above (what a pool rank's heartbeat
// carries, so a failure report can quote it).
std::string LastLogLine();
// Makes `line` the LastLogLine without logging it (a pool agent passes on the output
// of the job it launched).
void RememberLogLine(const std::string& line);

std::string StrFormat(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace trainyard
