// Whether this test binary is built with ASan or TSan (scripts/asan-check.sh,
// scripts/race-check.sh), where everything runs several times slower: long tests trim their
// sweeps there, saying so, and keep every assertion.
#pragma once

namespace kvc::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif

}  // namespace kvc::testing
