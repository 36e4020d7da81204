// Polling for a condition in end-to-end tests (daemons, clusters): the state they wait on
// lives in other processes, so there is nothing to block on.
#pragma once

#include <chrono>
#include <thread>

namespace kvc::testing {

// Polls `done` every `poll_ms` for up to `seconds`; whether it came true.
template <typename F>
bool WaitFor(F done, double seconds, int poll_ms = 50) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return true;
}

}  // namespace kvc::testing
