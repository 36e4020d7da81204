// The clocks: wall time where a value is stored or sent (TTLs, leases on disk, logs),
// steady time for every interval measured inside one process.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvc {

using SteadyClock = std::chrono::steady_clock;

// Seconds since the Unix epoch (what TTLs and stored expiry times are in).
inline int64_t WallSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Milliseconds on the steady clock (intervals and back-off deadlines within a process).
inline int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

}  // namespace kvc
