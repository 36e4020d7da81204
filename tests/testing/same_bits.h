// Bit-for-bit comparison of float results: what a kernel that promises the CPU's bits is
// held to (not closeness).
#pragma once

#include <cstring>
#include <vector>

namespace kvc::testing {

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace kvc::testing
