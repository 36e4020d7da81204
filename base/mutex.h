// A mutex and its scoped lock that clang's thread-safety analysis follows, so the fields a
// mutex guards are declared (ABSL_GUARDED_BY) and every access without it is a compile
// error in scripts/lock-check.sh (storage/ and cachesvc/) (clang -Wthread-safety; GCC ignores the
// annotations and std::mutex carries none). Underneath is a std::mutex: same speed, and TSan sees
// it.
//
// A function that needs the lock says so (ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu)) and may
// release it for I/O with mu.unlock() ... mu.lock(), as long as it holds it again on
// return. Waits use std::condition_variable_any on the Mutex itself: cv.wait(mu) releases
// and retakes it, and a condition is written as a loop in the function that holds the lock
// (a predicate lambda would be analysed as a function holding nothing).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvc {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds the mutex for its scope; unlock() gives it up early (for good, or until lock()).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.lock();
    held_ = true;
  }
  void unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.unlock();
    held_ = false;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// Waits on `cv` with `mu` held until `flag` (a field `mu` guards) is true or `timeout` has
// passed, whichever is first; returns the flag. A wake-up before either waits again.
inline bool WaitForFlag(std::condition_variable_any& cv, Mutex& mu, const bool& flag,
                        std::chrono::steady_clock::duration timeout)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!flag && cv.wait_until(mu, until) == std::cv_status::no_timeout) {
  }
  return flag;
}

}  // namespace kvc

namespace kvc::storage {  // where the tiers' code names them
using ::kvc::Mutex;
using ::kvc::MutexLock;
}  // namespace kvc::storage
