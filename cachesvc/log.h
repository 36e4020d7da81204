// Structured logs: one JSON object per line on stderr, for log shippers.
//
//   {"ts":"2026-11-30T06:40:01.123Z","level":"info","event":"call","method":"Fetch",...}
//
// Fields are added by the caller; values are escaped. Bearer tokens are never passed in
// (calls are logged by tenant name). Thread-safe: a line is written with one call.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kvc::cachesvc {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Lines below this level are dropped (default kInfo).
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
// "debug", "info", "warn" or "error"; false for anything else.
bool ParseLogLevel(absl::string_view text, LogLevel* level);

class LogLine {
 public:
  LogLine(LogLevel level, absl::string_view event);
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  ~LogLine();  // writes the line (if the level is enabled)

  LogLine& Str(absl::string_view key, absl::string_view value);
  LogLine& Int(absl::string_view key, int64_t value);
  LogLine& Num(absl::string_view key, double value);

 private:
  void Key(absl::string_view key);
  bool on_;
  std::string text_;
};

}  // namespace kvc::cachesvc
