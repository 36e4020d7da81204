// KVC_CHECK: the one way to stop on a broken invariant (a programmer error).
//
// Operating errors (bad input, I/O, a missing key) return absl::Status instead; a
// KVC_CHECK that fires means the code itself is wrong, so it prints where and why and
// aborts. Usage: KVC_CHECK(n % 2 == 0) << "n is " << n;
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace kvc::internal {

class CheckFailure {
 public:
  CheckFailure(const char* condition, const char* file, int line) {
    stream_ << file << ":" << line << ": KVC_CHECK(" << condition << ") failed: ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream << msg` type-check as void.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace kvc::internal

#define KVC_CHECK(condition)                 \
  (condition) ? (void)0                      \
              : ::kvc::internal::Voidify() & \
                    ::kvc::internal::CheckFailure(#condition, __FILE__, __LINE__).stream()
