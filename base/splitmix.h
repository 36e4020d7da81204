// splitmix64: a portable, seedable generator. std:: distributions differ between standard
// libraries; what must be the same on every machine (random weights, sampled tokens) draws
// from this instead.
#pragma once

#include <cstdint>

namespace kvc {

// The next value of the stream whose state is `s` (advanced).
inline uint64_t SplitMix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace kvc
