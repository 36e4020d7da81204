// The model's small ops against straightforward scalar references (notes §4–6).
#include "engine/cpu/ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "engine/cpu/exp.h"
#include "engine/cpu/exp_avx2.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/softplus.h"
#include "engine/cpu/swiglu.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace kvc::cpu {
namespace {

TEST(OpsTest, RmsNormMatchesReference) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::normal_distribution<float> nd;
  for (int n : {16, 64, 256}) {
    std::vector<float> x(n), w(n), y(n);
    for (int i = 0; i < n; ++i) x[i] = nd(rng) * 3, w[i] = 1 + 0.1f * nd(rng);
    RmsNorm(x.data(), w.data(), n, 1e-6, y.data());
    long double ss = 0;
    for (float v : x) ss += static_cast<long double>(v) * v;
    const long double r = 1.0L / std::sqrt(ss / n + 1e-6L);
    for (int i = 0; i < n; ++i)
      EXPECT_NEAR(y[i], x[i] * r * w[i], 1e-5 * std::abs(x[i] * r * w[i]) + 1e-7);
  }
}

TEST(OpsTest, RopeRotatesTheTailPairsAndInverts) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::normal_distribution<float> nd;
  const int dim = 64, rd = 16;
  const std::vector<double> f = RopeFrequencies(rd, 160000, 1024, 4, 32, 1);
  std::vector<float> x(dim);
  for (float& v : x) v = nd(rng);
  std::vector<float> y = x;
  const int64_t pos = 1 + static_cast<int64_t>(rng() % 5000);
  ApplyRope(y.data(), dim, f, pos);
  for (int i = 0; i < dim - rd; ++i) EXPECT_EQ(y[i], x[i]);  // the head is untouched
  for (int i = 0; i < rd / 2; ++i) {
    const std::complex<double> z(x[dim - rd + 2 * i], x[dim - rd + 2 * i + 1]);
    const std::complex<double> r = z * std::polar(1.0, pos * f[i]);
    EXPECT_NEAR(y[dim - rd + 2 * i], r.real(), 1e-5);
    EXPECT_NEAR(y[dim - rd + 2 * i + 1], r.imag(), 1e-5);
  }
  ApplyRope(y.data(), dim, f, pos, /*inverse=*/true);
  for (int i = 0; i < dim; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

TEST(OpsTest, YarnFrequenciesFollowTheRamp) {
  // Without YaRN: base^(-2i/rd). With it, the high frequencies (i below `low`) are kept,
  // the low ones (i above `high`) divided by the factor (notes §6).
  const int rd = 64;
  const std::vector<double> plain = RopeFrequencies(rd, 10000, 0, 16, 32, 1);
  for (int i = 0; i < rd / 2; ++i) EXPECT_DOUBLE_EQ(plain[i], std::pow(10000.0, -2.0 * i / rd));
  const std::vector<double> yarn = RopeFrequencies(rd, 160000, 65536, 16, 32, 1);
  const std::vector<double> base = RopeFrequencies(rd, 160000, 0, 16, 32, 1);
  auto corr = [&](double r) {
    return rd * std::log(65536.0 / (2 * std::numbers::pi * r)) / (2 * std::log(160000.0));
  };
  const int low = std::max(0, static_cast<int>(std::floor(corr(32))));
  const int high = std::min(rd - 1, static_cast<int>(std::ceil(corr(1))));
  for (int i = 0; i < rd / 2; ++i) {
    if (i <= low) {
      EXPECT_DOUBLE_EQ(yarn[i], base[i]) << i;
    }
    if (i >= high) {
      EXPECT_NEAR(yarn[i], base[i] / 16, 1e-18) << i;
    }
  }
}

TEST(OpsTest, SinkhornGivesADoublyStochasticComb) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::normal_distribution<float> nd;
  const int hc = 4;
  std::vector<float> m(24), base(24), scale = {1.0f, 1.0f, 1.0f};
  for (int i = 0; i < 24; ++i) m[i] = nd(rng), base[i] = nd(rng);
  const HcCoefficients c = HcFromMixes(m, base, scale, hc, 20, 1e-6);
  for (int j = 0; j < hc; ++j) {
    EXPECT_NEAR(c.pre[j], 1 / (1 + std::exp(-(m[j] + base[j]))) + 1e-6, 1e-6);
    EXPECT_NEAR(c.post[j], 2 / (1 + std::exp(-(m[4 + j] + base[4 + j]))), 1e-6);
    float row = 0, col = 0;
    for (int k = 0; k < hc; ++k) row += c.comb[j * hc + k], col += c.comb[k * hc + j];
    // 20 alternating steps (the reference's count) do not always bring the rows within
    // 1e-3 (a seed gave 1.05e-3); the last step normalizes the columns exactly.
    EXPECT_NEAR(row, 1.0f, 0.05);
    EXPECT_NEAR(col, 1.0f, 1e-5);
  }
  // With enough steps the rows converge too: the iteration is Sinkhorn's.
  const HcCoefficients many = HcFromMixes(m, base, scale, hc, 500, 1e-6);
  for (int j = 0; j < hc; ++j) {
    float row = 0;
    for (int k = 0; k < hc; ++k) row += many.comb[j * hc + k];
    EXPECT_NEAR(row, 1.0f, 1e-4) << "row " << j;
  }
}

TEST(OpsTest, HcPostUsesTheTransposedComb) {
  const int hc = 2, d = 1;
  HcCoefficients c{{0, 0}, {0.5f, 2.0f}, {0.1f, 0.9f, 0.7f, 0.3f}};
  const float f = 3.0f, R[2] = {5.0f, 7.0f};
  float out[2];
  HcPost(&f, R, c, hc, d, out);
  EXPECT_FLOAT_EQ(out[0], 0.5f * 3 + 0.1f * 5 + 0.7f * 7);  // Σ_j comb[j][0]·R[j]
  EXPECT_FLOAT_EQ(out[1], 2.0f * 3 + 0.9f * 5 + 0.3f * 7);
}

TEST(OpsTest, TopKBreaksTiesTowardsLowerIndexAndSkipsMinusInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> s = {1, 3, 3, -inf, 2, 3, -inf};
  EXPECT_EQ(TopKAscending(s, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(TopKAscending(s, 4), (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(TopKAscending(s, 10), (std::vector<int32_t>{0, 1, 2, 4, 5}));
  std::mt19937_64 rng(testing::FreshSeed());
  for (bool rising : {false, true}) {  // random, and mostly rising as trained indexers score
    std::vector<float> r(500);
    for (size_t i = 0; i < r.size(); ++i)
      r[i] = static_cast<float>(rng() % 50) + (rising ? static_cast<float>(i / 8) : 0.0f);
    const std::vector<int32_t> got = TopKAscending(r, 17);
    std::vector<int32_t> order(r.size());
    for (size_t i = 0; i < r.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
    order.resize(17);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(got, order) << (rising ? "rising" : "random") << " scores";
  }
}

// Every n-th float bit pattern, NaNs and infinities included.
std::vector<float> EveryNthFloat(uint64_t n) {
  std::vector<float> out;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += n) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, 4);
    out.push_back(x);
  }
  return out;
}

// ExpF (the engine's exp, the same bits on the CPU and the GPU) against exp in double:
// within 1 ulp over a sweep of every 4099th float, and the edges right.
TEST(OpsTest, ExpFIsWithinOneUlpAndHandlesTheEdges) {
  int64_t checked = 0;
  for (const float x : EveryNthFloat(4099)) {
    if (std::isnan(x)) continue;
    const double ref = std::exp(static_cast<double>(x));
    const float got = ExpF(x);
    if (ref > std::numeric_limits<float>::max()) {
      ASSERT_TRUE(std::isinf(got)) << x;
      continue;
    }
    const float lo = static_cast<float>(ref);
    const double ulp = std::nextafter(lo, std::numeric_limits<float>::infinity()) - lo;
    ASSERT_LE(std::abs(static_cast<double>(got) - ref), ulp) << "x " << x;
    ++checked;
  }
  EXPECT_GT(checked, 700000);  // the rest are NaNs or overflow to +inf
  EXPECT_EQ(ExpF(0.0f), 1.0f);
  EXPECT_EQ(ExpF(-0.0f), 1.0f);
  EXPECT_EQ(ExpF(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isinf(ExpF(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(ExpF(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(ExpF(88.8f)));
  EXPECT_GT(ExpF(-100.0f), 0.0f);  // a subnormal, not flushed
  EXPECT_LT(ExpF(-100.0f), std::numeric_limits<float>::min());
}

// The last step, p · 2^k, is built from exponent bits on the host; it must give the bits
// ldexp gives (the GPU's form) for every k the range allows, subnormal results included.
TEST(OpsTest, ExpFScalesByTwoToTheKAsLdexpDoes) {
  int64_t checked = 0;
  for (const float x : EveryNthFloat(4099)) {
    if (!(x >= -104.0f && x <= 88.72283935546875f)) continue;
    double k;
    const double p = exp_detail::Reduced(x, &k);
    const float want = static_cast<float>(std::ldexp(p, static_cast<int>(k)));
    ASSERT_EQ(std::bit_cast<uint32_t>(ExpF(x)), std::bit_cast<uint32_t>(want)) << "x " << x;
    ++checked;
  }
  for (const float x : {-104.0f, -103.97f, -87.34f, -0.5f, 0.5f, 88.72283935546875f}) {
    double k;
    const double p = exp_detail::Reduced(x, &k);
    EXPECT_EQ(std::bit_cast<uint32_t>(ExpF(x)),
              std::bit_cast<uint32_t>(static_cast<float>(std::ldexp(p, static_cast<int>(k)))))
        << x;
  }
  EXPECT_GT(checked, 100000);
}

// ExpF8, eight lanes at once (the attention's softmax), against ExpF lane by lane over the
// sweep, the edges (NaN, ±inf, overflow, underflow, subnormal results) among the lanes.
__attribute__((target("avx2,fma"))) void Expf8Into(const float* x, float* out) {
  _mm256_storeu_ps(out, ExpF8(_mm256_loadu_ps(x)));
}

TEST(OpsTest, ExpF8GivesExpFsBitsInEveryLane) {
  if (!Avx2FmaInUse()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
  std::vector<float> xs = EveryNthFloat(4099);
  for (float x : {0.0f, -0.0f, 88.72283935546875f, 88.7229f, -103.99f, -104.0f, -104.01f, -87.5f,
                  -100.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    xs.push_back(x);
  while (xs.size() % 8 != 0) xs.push_back(1.0f);
  for (size_t i = 0; i < xs.size(); i += 8) {
    float got[8];
    Expf8Into(&xs[i], got);
    for (int j = 0; j < 8; ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(ExpF(xs[i + j])))
          << "x " << xs[i + j];
    }
  }
}

// The router's shared log1p against the C library's in double, over a sweep of every
// 4099th float above −1: within one float ulp; then the score built on it.
TEST(OpsTest, Log1pFIsWithinOneUlpAndSqrtSoftplusFollows) {
  int64_t checked = 0;
  for (const float x : EveryNthFloat(4099)) {
    if (std::isnan(x) || x <= -1.0f || std::isinf(x)) continue;
    const double ref = std::log1p(static_cast<double>(x));
    const float got = Log1pF(x);
    const float lo = static_cast<float>(ref);
    const double ulp = std::abs(
        static_cast<double>(std::nextafter(lo, std::numeric_limits<float>::infinity())) - lo);
    ASSERT_LE(std::abs(static_cast<double>(got) - ref), ulp) << "x " << x;
    ++checked;
  }
  EXPECT_GT(checked, 500000);
  EXPECT_EQ(Log1pF(0.0f), 0.0f);
  EXPECT_EQ(Log1pF(-1.0f), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Log1pF(-2.0f)));
  EXPECT_TRUE(std::isnan(Log1pF(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(Log1pF(std::numeric_limits<float>::infinity())));
  for (float x = -30.0f; x < 30.0f; x += 0.0137f) {
    const double want = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(static_cast<double>(x))));
    ASSERT_NEAR(SqrtSoftplus(x), want, 3e-7 * want) << x;
  }
}

// The experts' activation against its definition in double: weight · silu(min(g, limit)) ·
// clamp(u, −limit, limit), within a few float roundings; NaN passes through as it did with
// std::min and std::clamp.
TEST(OpsTest, SwiGluIsTheClampedGatedSiluAndPassesNan) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 4.0f);
  const float limit = 3.0f;
  int clamped = 0;
  for (int i = 0; i < 100000; ++i) {
    const float g = n(rng), u = n(rng), w = std::abs(n(rng)) + 0.1f;
    const double gi = std::min<double>(g, limit), ui = std::clamp<double>(u, -limit, limit);
    const double want = w * (gi / (1.0 + std::exp(-gi))) * ui;
    const float got = SwiGlu(g, u, limit, w);
    ASSERT_NEAR(got, want, 1e-6 * std::max(1.0, std::abs(want))) << g << " " << u << " " << w;
    clamped += g > limit || std::abs(u) > limit;
  }
  EXPECT_GT(clamped, 10000) << "seed " << seed;  // the limit acted
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(SwiGlu(nan, 1.0f, limit, 1.0f)));
  EXPECT_TRUE(std::isnan(SwiGlu(1.0f, nan, limit, 1.0f)));
  EXPECT_EQ(SwiGlu(100.0f, 100.0f, limit, 2.0f), SwiGlu(limit, limit, limit, 2.0f));
}

}  // namespace
}  // namespace kvc::cpu
