#include "cachesvc/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvc::cachesvc {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

constexpr const char* kLevelNames[] = {"debug", "info", "warn", "error"};

void AppendJsonString(std::string* out, absl::string_view s) {
  out->push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

std::string UtcNow() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return absl::StrFormat("%s.%03dZ", buf, static_cast<int>(ms));
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  for (int i = 0; i < 4; ++i) {
    if (text == kLevelNames[i]) {
      *level = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

LogLine::LogLine(LogLevel level, absl::string_view event) : on_(LogEnabled(level)) {
  if (!on_) return;
  text_ = "{\"ts\":\"" + UtcNow() + "\",\"level\":\"" + kLevelNames[static_cast<int>(level)] +
          "\",\"event\":";
  AppendJsonString(&text_, event);
}

LogLine::~LogLine() {
  if (!on_) return;
  text_ += "}\n";
  // One write(2) per line: lines from concurrent threads never interleave.
  (void)!::write(STDERR_FILENO, text_.data(), text_.size());
}

void LogLine::Key(absl::string_view key) {
  text_.push_back(',');
  AppendJsonString(&text_, key);
  text_.push_back(':');
}

LogLine& LogLine::Str(absl::string_view key, absl::string_view value) {
  if (on_) {
    Key(key);
    AppendJsonString(&text_, value);
  }
  return *this;
}

LogLine& LogLine::Int(absl::string_view key, int64_t value) {
  if (on_) {
    Key(key);
    absl::StrAppend(&text_, value);
  }
  return *this;
}

LogLine& LogLine::Num(absl::string_view key, double value) {
  if (on_) {
    Key(key);
    absl::StrAppendFormat(&text_, "%.3f", value);
  }
  return *this;
}

}  // namespace kvc::cachesvc
