// The KV codecs against (1) a plain brute-force scalar reference written here, (2) golden
// vectors from an independent NumPy implementation (scripts/kv_codec_reference.py), and
// (3) hand-checked edge cases.
#include "engine/spec/kv_codec.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace kvc {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- A deliberately naive reference: nearest representable value, ties to even code ----

float RefE2M1Value(int code) {
  static const float kMag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}

float RefE4M3Value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double v = e == 0 ? m * std::pow(2.0, -9) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return static_cast<float>((code & 0x80) ? -v : v);
}

// Nearest of codes [0, count) by value (exact double distances), ties to even code.
template <typename ValueFn>
int RefNearest(double a, int count, ValueFn value) {
  int best = 0;
  double best_d = std::fabs(a - value(0));
  for (int c = 1; c < count; ++c) {
    const double d = std::fabs(a - value(c));
    if (d < best_d || (d == best_d && c % 2 == 0)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

int RefEncodeE2M1(float x) {
  const int m = RefNearest(std::fmin(std::fabs(x), 6.0f), 8, RefE2M1Value);
  return m | (std::signbit(x) ? 8 : 0);
}

int RefEncodeE4M3(float x) {
  const int m = RefNearest(std::fmin(std::fabs(x), 448.0f), 0x7F, RefE4M3Value);
  return m | (std::signbit(x) ? 0x80 : 0);
}

int RefCeilPow2Code(float y) { return static_cast<int>(std::ceil(std::log2(double{y}))) + 127; }

// Quantize-dequantize of one block, straight from the reference's formulas.
std::vector<float> RefFakeQuant(KvFormat f, const std::vector<float>& x) {
  float amax = 0;
  for (float v : x) amax = std::fmax(amax, std::fabs(v));
  float s;
  if (f == KvFormat::kMainKv) {
    s = RefE4M3Value(RefEncodeE4M3(std::fmax(amax, 6.0f / 512.0f) / 6.0f));
  } else if (f == KvFormat::kIndexK) {
    s = std::ldexp(1.0f,
                   RefCeilPow2Code(std::fmax(amax, 6.0f * std::ldexp(1.0f, -126)) / 6.0f) - 127);
  } else {
    s = std::ldexp(1.0f, RefCeilPow2Code(std::fmax(amax, 1e-4f) / 448.0f) - 127);
  }
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float q = x[i] / s;
    y[i] =
        (f == KvFormat::kSwaKv ? RefE4M3Value(RefEncodeE4M3(q)) : RefE2M1Value(RefEncodeE2M1(q))) *
        s;
  }
  return y;
}

// Gaussian blocks of 16 whose scales span binades [min_exp, max_exp] (fresh seed, printed).
// The default range goes past both ends of what the formats represent.
std::vector<float> RandomValues(std::mt19937_64& rng, size_t n, int min_exp = -30,
                                int max_exp = 12) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(min_exp, max_exp);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i += 16) {
    const float scale = std::ldexp(1.0f, exponent(rng));  // per block, like real activations
    for (size_t j = i; j < std::min(n, i + 16); ++j) v[j] = normal(rng) * scale;
  }
  return v;
}

bool SameBits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

struct Packed {
  std::vector<uint8_t> codes, scales;
};

Packed QuantizeAll(KvFormat f, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  Packed p{std::vector<uint8_t>(CodesBytes(f, n)), std::vector<uint8_t>(ScalesBytes(f, n))};
  Quantize(f, x, p.codes, p.scales);
  return p;
}

std::vector<float> DequantizeAll(KvFormat f, const Packed& p, size_t n) {
  std::vector<float> y(n);
  Dequantize(f, p.codes, p.scales, y);
  return y;
}

constexpr KvFormat kAllFormats[] = {KvFormat::kMainKv, KvFormat::kIndexK, KvFormat::kSwaKv};

// ---- Scalar formats ----

TEST(KvCodecTest, EveryE2M1CodeRoundTrips) {
  for (int code = 0; code < 16; ++code) {
    const float v = DecodeE2M1(static_cast<uint8_t>(code));
    EXPECT_TRUE(SameBits(v, RefE2M1Value(code))) << code;
    EXPECT_EQ(EncodeE2M1(v), code) << "code " << code << " value " << v;
  }
  EXPECT_TRUE(std::signbit(DecodeE2M1(8)));  // code 8 is -0
}

TEST(KvCodecTest, E2M1TiesRoundToEven) {
  const struct {
    float in, out;
  } ties[] = {{0.25f, 0}, {0.75f, 1},   {1.25f, 1},  {1.75f, 2}, {2.5f, 2},  {3.5f, 4},
              {5.0f, 4},  {-0.75f, -1}, {-5.0f, -4}, {7.0f, 6},  {1e30f, 6}, {-kInf, -6}};
  for (const auto& t : ties) EXPECT_EQ(DecodeE2M1(EncodeE2M1(t.in)), t.out) << t.in;
  EXPECT_EQ(EncodeE2M1(-0.1f), 8);  // rounds to -0: the sign survives
  EXPECT_EQ(EncodeE2M1(kNaN), 0);
}

TEST(KvCodecTest, E2M1MatchesBruteForceOnRandomValues) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::uniform_real_distribution<float> u(-7.0f, 7.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng);
    ASSERT_EQ(EncodeE2M1(x), RefEncodeE2M1(x)) << x;
  }
}

TEST(KvCodecTest, EveryE4M3CodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float v = DecodeE4M3(static_cast<uint8_t>(code));
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << code;
      continue;
    }
    EXPECT_TRUE(SameBits(v, RefE4M3Value(code))) << code;
    EXPECT_EQ(EncodeE4M3(v), code) << code;
  }
  EXPECT_EQ(DecodeE4M3(0x7E), 448.0f);
  EXPECT_EQ(DecodeE4M3(0x01), std::ldexp(1.0f, -9));
}

TEST(KvCodecTest, E4M3MatchesBruteForceIncludingSubnormalsAndSaturation) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-12, 10);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mant(rng), exponent(rng));
    ASSERT_EQ(EncodeE4M3(x), RefEncodeE4M3(x)) << x;
  }
  // Every midpoint between neighbouring codes is a tie that must go to the even code.
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = (RefE4M3Value(c) + RefE4M3Value(c + 1)) / 2;
    EXPECT_EQ(EncodeE4M3(mid), RefEncodeE4M3(mid)) << mid;
    EXPECT_EQ(EncodeE4M3(mid) % 2, 0) << mid;
  }
  EXPECT_EQ(EncodeE4M3(470.0f), 0x7E);  // would round to 480 (NaN pattern): saturates
  EXPECT_EQ(EncodeE4M3(kInf), 0x7E);
  EXPECT_EQ(EncodeE4M3(-kInf), 0xFE);
  EXPECT_EQ(EncodeE4M3(kNaN), 0x7F);
}

TEST(KvCodecTest, E8M0CeilPow2MatchesLog2) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-125, 120);
  for (int i = 0; i < 100000; ++i) {
    const float y = std::ldexp(mant(rng), exponent(rng));
    ASSERT_EQ(E8M0CeilPow2(y), RefCeilPow2Code(y)) << y;
  }
  EXPECT_EQ(E8M0CeilPow2(1.0f), 127);  // exact powers of two do not round up
  EXPECT_EQ(E8M0CeilPow2(std::nextafter(1.0f, 2.0f)), 128);
  EXPECT_EQ(E8M0CeilPow2(kInf), 254);
  EXPECT_EQ(DecodeE8M0(127), 1.0f);
  EXPECT_TRUE(std::isnan(DecodeE8M0(255)));
}

// ---- Block formats ----

TEST(KvCodecTest, BlockQuantizationMatchesScalarReference) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (KvFormat f : kAllFormats) {
    const std::vector<float> x = RandomValues(rng, 512 * 64);
    const std::vector<float> y = DequantizeAll(f, QuantizeAll(f, x), x.size());
    const size_t block = SpecOf(f).scale_block;
    for (size_t b = 0; b < x.size(); b += block) {
      const std::vector<float> xb(x.begin() + b, x.begin() + b + block);
      const std::vector<float> ref = RefFakeQuant(f, xb);
      for (size_t i = 0; i < block; ++i) {
        ASSERT_TRUE(SameBits(y[b + i], ref[i]))
            << SpecOf(f).name << " element " << b + i << ": x=" << x[b + i] << " ours=" << y[b + i]
            << " ref=" << ref[i];
      }
    }
  }
}

TEST(KvCodecTest, FakeQuantizeEqualsQuantizeThenDequantize) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (KvFormat f : kAllFormats) {
    std::vector<float> x = RandomValues(rng, 4096);
    const std::vector<float> y = DequantizeAll(f, QuantizeAll(f, x), x.size());
    FakeQuantize(f, x);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(SameBits(x[i], y[i])) << i;
  }
}

TEST(KvCodecTest, RoundTripErrorIsBounded) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (KvFormat f : kAllFormats) {
    // Inside the range every format represents without saturating (main KV: |x| <= 2688;
    // the model's latents stay below ~10).
    const std::vector<float> x = RandomValues(rng, 512 * 32, -6, 6);
    const Packed p = QuantizeAll(f, x);
    const std::vector<float> y = DequantizeAll(f, p, x.size());
    const size_t block = SpecOf(f).scale_block;
    const bool fp4 = SpecOf(f).value_bits == 4;
    double err2 = 0, sig2 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float s = f == KvFormat::kMainKv ? DecodeE4M3(p.scales[i / block])
                                             : DecodeE8M0(p.scales[i / block]);
      // Half the widest gap between neighbouring codes, in units of the scale: 1 for E2M1
      // (between 4 and 6), 16 for E4M3 (between 416 and 448). A main-KV scale may round
      // below amax / 6; the values past 6·s then clamp to it.
      const float max_code = fp4 ? 6.0f : 448.0f;
      const float bound = std::fabs(x[i]) > max_code * s ? std::fabs(x[i]) - max_code * s + 1e-30f
                                                         : (fp4 ? 1.0f : 16.0f) * s;
      ASSERT_LE(std::fabs(x[i] - y[i]), bound) << SpecOf(f).name << " x=" << x[i] << " y=" << y[i];
      err2 += double(x[i] - y[i]) * (x[i] - y[i]);
      sig2 += double(x[i]) * x[i];
    }
    // Gaussian blocks: E2M1 keeps ~ -19 dB of error energy, E4M3 far less.
    EXPECT_LT(err2 / sig2, fp4 ? 0.03 : 1e-3) << SpecOf(f).name;
  }
}

TEST(KvCodecTest, NibbleOrderIsLowNibbleEvenElement) {
  // Main format, amax 6: the scale is e4m3(1.0) = 0x38 and codes are the values themselves.
  std::vector<float> x = {0.5f, 6, -1, 2, 0, -0.0f, 3, -6, 1.5f, 4, -0.5f, 1, 0, 0, 0, 0};
  const Packed p = QuantizeAll(KvFormat::kMainKv, x);
  ASSERT_EQ(p.scales.size(), 1u);
  EXPECT_EQ(p.scales[0], 0x38);
  EXPECT_EQ(p.codes[0], 0x71);  // 0.5 → 1 (low), 6 → 7 (high)
  EXPECT_EQ(p.codes[1], 0x4A);  // -1 → 0xA, 2 → 4
  EXPECT_EQ(p.codes[2], 0x80);  // 0 → 0, -0 → 8
  EXPECT_EQ(p.codes[3], 0xF5);  // 3 → 5, -6 → 0xF
  EXPECT_EQ(p.codes[4], 0x63);  // 1.5 → 3, 4 → 6
  EXPECT_EQ(p.codes[5], 0x29);  // -0.5 → 9, 1 → 2
}

TEST(KvCodecTest, ScaleEdgeCases) {
  // All zeros: the amax floor keeps the scale finite and > 0; values stay exactly 0.
  std::vector<float> zeros(32, 0.0f);
  Packed main = QuantizeAll(KvFormat::kMainKv, zeros);
  EXPECT_EQ(main.scales[0], 0x01);  // e4m3(2^-9), the smallest subnormal
  Packed index = QuantizeAll(KvFormat::kIndexK, zeros);
  EXPECT_EQ(index.scales[0], 1);  // 2^-126
  Packed swa = QuantizeAll(KvFormat::kSwaKv, zeros);
  EXPECT_EQ(swa.scales[0], RefCeilPow2Code(1e-4f / 448.0f));
  for (KvFormat f : kAllFormats) {
    for (float v : DequantizeAll(f, QuantizeAll(f, zeros), zeros.size())) EXPECT_EQ(v, 0.0f);
  }
  // Negative zeros keep their sign through the round trip.
  std::vector<float> negzeros(32, -0.0f);
  for (KvFormat f : kAllFormats) {
    for (float v : DequantizeAll(f, QuantizeAll(f, negzeros), 32)) EXPECT_TRUE(std::signbit(v));
  }
  // Tiny values below the floor: everything rounds to zero or the smallest code.
  std::vector<float> tiny(32, 1e-30f);
  for (float v : DequantizeAll(KvFormat::kMainKv, QuantizeAll(KvFormat::kMainKv, tiny), 32)) {
    EXPECT_EQ(v, 0.0f);
  }
  // Huge: the main scale saturates at 448, so values saturate at 6 × 448 = 2688.
  std::vector<float> huge(16, 1e6f);
  huge[1] = -1e6f;
  std::vector<float> y = DequantizeAll(KvFormat::kMainKv, QuantizeAll(KvFormat::kMainKv, huge), 16);
  EXPECT_EQ(y[0], 2688.0f);
  EXPECT_EQ(y[1], -2688.0f);
  // Index K has a power-of-two scale: huge values still round trip to within the grid.
  std::vector<float> big(32, 3e20f);
  y = DequantizeAll(KvFormat::kIndexK, QuantizeAll(KvFormat::kIndexK, big), 32);
  EXPECT_NEAR(y[0], 3e20f, 3e20f * 0.34f);
}

TEST(KvCodecTest, NonFiniteInputHasDefinedResult) {
  for (KvFormat f : kAllFormats) {
    const size_t block = SpecOf(f).scale_block;
    std::vector<float> x(block, 1.0f);
    x[0] = kNaN;
    x[1] = kInf;
    x[2] = -kInf;
    const Packed p = QuantizeAll(f, x);
    const std::vector<float> y = DequantizeAll(f, p, block);
    EXPECT_EQ(y[0], 0.0f) << SpecOf(f).name;                         // NaN → +0
    EXPECT_TRUE(std::isfinite(y[1]) && y[1] > 0) << SpecOf(f).name;  // +inf → largest
    EXPECT_TRUE(std::isfinite(y[2]) && y[2] == -y[1]) << SpecOf(f).name;
    for (float v : y) EXPECT_TRUE(std::isfinite(v)) << SpecOf(f).name;
    // Values near FLT_MAX saturate to finite values too: the largest value of the format
    // (main KV: 6 × the largest E4M3 scale, 448).
    std::vector<float> max_floats(block, std::numeric_limits<float>::max());
    const float largest = f == KvFormat::kMainKv ? 2688.0f : 1e37f;
    for (float v : DequantizeAll(f, QuantizeAll(f, max_floats), block)) {
      EXPECT_TRUE(std::isfinite(v) && v >= largest) << SpecOf(f).name << " " << v;
    }
    // A block with only NaN behaves like zeros.
    std::vector<float> nans(block, kNaN);
    for (float v : DequantizeAll(f, QuantizeAll(f, nans), block)) EXPECT_EQ(v, 0.0f);
  }
}

// ---- Golden vectors from the independent NumPy implementation ----

std::string ReadGolden(const std::string& name) {
  const std::string path = std::string(KVC_SOURCE_DIR) + "/tests/engine/spec/golden/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

TEST(KvCodecTest, GoldenVectorsMatchByteForByte) {
  for (KvFormat f : kAllFormats) {
    const std::string name(SpecOf(f).name);
    const std::vector<float> x = AsFloats(ReadGolden(name + "_input.f32"));
    const std::string packed = ReadGolden(name + "_packed.bin");
    const std::vector<float> want = AsFloats(ReadGolden(name + "_dequant.f32"));
    ASSERT_FALSE(x.empty()) << name;
    const Packed p = QuantizeAll(f, x);
    std::string ours(p.codes.begin(), p.codes.end());
    ours.append(p.scales.begin(), p.scales.end());
    ASSERT_EQ(ours.size(), packed.size()) << name;
    for (size_t i = 0; i < packed.size(); ++i) {
      ASSERT_EQ(static_cast<uint8_t>(ours[i]), static_cast<uint8_t>(packed[i]))
          << name << " packed byte " << i;
    }
    const std::vector<float> y = DequantizeAll(f, p, x.size());
    ASSERT_EQ(y.size(), want.size());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(SameBits(y[i], want[i])) << name << " " << i;
  }
}

}  // namespace
}  // namespace kvc
