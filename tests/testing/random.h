// Random test inputs (seed them with FreshSeed so failures can be replayed).
#pragma once

#include <random>
#include <vector>

namespace kvc::testing {

// n normally distributed floats with the given standard deviation (never all zero).
inline std::vector<float> NormalFloats(std::mt19937_64& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace kvc::testing
