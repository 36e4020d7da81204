// The engine's GEMM: correct against a double-precision reference, and batch invariant —
// a row's result is the same bits whatever else is in the call, the thread count, or the
// instruction set.
#include "engine/cpu/gemm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace kvc::cpu {
namespace {

std::vector<float> Random(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

TEST(GemmTest, MatchesDoublePrecisionReference) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (auto [m, k, n] : {std::tuple{1, 7, 3}, {5, 64, 17}, {33, 256, 64}, {130, 96, 200}}) {
    const std::vector<float> x = Random(rng, m * k), w = Random(rng, n * k);
    const PackedMatrix p(w, n, k);
    std::vector<float> y(m * n);
    Gemm(x.data(), m, p, y.data());
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (int t = 0; t < k; ++t) {
          ref += static_cast<double>(x[i * k + t]) * w[j * k + t];
          mag += std::abs(static_cast<double>(x[i * k + t]) * w[j * k + t]);
        }
        ASSERT_NEAR(y[i * n + j], ref, 1e-5 * mag + 1e-6) << m << "x" << k << "x" << n;
      }
    }
  }
}

TEST(GemmTest, RowsAreBatchInvariant) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (auto [k, n] : {std::pair{256, 64}, {64, 256}, {1024, 24}, {128, 33}}) {
    const std::vector<float> x = Random(rng, 600 * k), w = Random(rng, n * k);
    const PackedMatrix p(w, n, k);
    // The last row of x, computed alone and inside calls of many sizes.
    std::vector<float> alone(n);
    GemmSerial(x.data() + 599 * k, 1, p, alone.data());
    for (int m : {2, 3, 4, 5, 8, 17, 64, 65, 300, 600}) {
      std::vector<float> y(m * n);
      Gemm(x.data() + (600 - m) * k, m, p, y.data());
      ASSERT_EQ(std::memcmp(y.data() + (m - 1) * n, alone.data(), n * sizeof(float)), 0)
          << "k=" << k << " n=" << n << " m=" << m;
    }
  }
}

TEST(GemmTest, PortablePathRoundsExactlyLikeTheVectorPath) {
  std::mt19937_64 rng(testing::FreshSeed());
  const int m = 37, k = 200, n = 45;
  const std::vector<float> x = Random(rng, m * k), w = Random(rng, n * k);
  const PackedMatrix p(w, n, k);
  std::vector<float> fast(m * n), portable(m * n);
  Gemm(x.data(), m, p, fast.data());
  UsePortableKernels(true);
  Gemm(x.data(), m, p, portable.data());
  UsePortableKernels(false);
  EXPECT_EQ(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace kvc::cpu
