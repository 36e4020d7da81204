#include "engine/spec/kv_codec.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/spec/check.h"

namespace kvc {
namespace {

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;
constexpr std::array<float, 8> kE2M1Magnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

constexpr KvFormatSpec kSpecs[] = {
    {"main", 16, 4},
    {"index", 32, 4},
    {"swa", 32, 8},
};

// Floors of the block maximum, from the reference: they keep the scale finite and > 0.
const float kMainAmaxFloor = 6.0f * std::ldexp(1.0f, -9);     // scale >= smallest E4M3
const float kIndexAmaxFloor = 6.0f * std::ldexp(1.0f, -126);  // scale >= smallest normal
constexpr float kSwaAmaxFloor = 1e-4f;

// Largest |x| of a block, NaN ignored (counts as 0), inf kept (saturates the scale).
float BlockAmax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) amax = a;  // false for NaN
  }
  return amax;
}

// Largest E8M0 scale whose product with the format's largest value is still a finite
// float. Capping the scale there makes a block holding inf (or values near FLT_MAX)
// saturate instead of dequantizing to inf.
uint8_t MaxFiniteE8M0Scale(float max_value) {
  uint8_t code = 254;
  while (!std::isfinite(DecodeE8M0(code) * max_value)) --code;
  return code;
}

// Scale code of one block.
uint8_t BlockScaleCode(KvFormat f, float amax) {
  switch (f) {
    case KvFormat::kMainKv:
      return EncodeE4M3(std::fmax(amax, kMainAmaxFloor) / kE2M1Max);
    case KvFormat::kIndexK: {
      static const uint8_t kMax = MaxFiniteE8M0Scale(kE2M1Max);
      return std::min(E8M0CeilPow2(std::fmax(amax, kIndexAmaxFloor) / kE2M1Max), kMax);
    }
    case KvFormat::kSwaKv: {
      static const uint8_t kMax = MaxFiniteE8M0Scale(kE4M3Max);
      return std::min(E8M0CeilPow2(std::fmax(amax, kSwaAmaxFloor) / kE4M3Max), kMax);
    }
  }
  KVC_CHECK(false) << "unknown KvFormat " << static_cast<int>(f);
  return 0;
}

float ScaleValue(KvFormat f, uint8_t code) {
  return f == KvFormat::kMainKv ? DecodeE4M3(code) : DecodeE8M0(code);
}

// Element code of x / s: division as in the reference (not multiplication by 1/s).
uint8_t ElementCode(KvFormat f, float x, float s) {
  if (std::isnan(x)) return 0;
  if (f == KvFormat::kSwaKv) {
    return EncodeE4M3(std::fmin(std::fmax(x / s, -kE4M3Max), kE4M3Max));
  }
  return EncodeE2M1(std::fmin(std::fmax(x / s, -kE2M1Max), kE2M1Max));
}

float ElementValue(KvFormat f, uint8_t code) {
  return f == KvFormat::kSwaKv ? DecodeE4M3(code) : DecodeE2M1(code);
}

void CheckCount(KvFormat f, int64_t n) {
  KVC_CHECK(n % SpecOf(f).scale_block == 0)
      << n << " values is not a whole number of " << SpecOf(f).name << " scale blocks ("
      << SpecOf(f).scale_block << ")";
}

}  // namespace

uint8_t EncodeE2M1(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Midpoints between neighbours; at an exact tie the even code wins (<= vs <).
  uint8_t m;
  if (a <= 0.25f)
    m = 0;
  else if (a < 0.75f)
    m = 1;
  else if (a <= 1.25f)
    m = 2;
  else if (a < 1.75f)
    m = 3;
  else if (a <= 2.5f)
    m = 4;
  else if (a < 3.5f)
    m = 5;
  else if (a <= 5.0f)
    m = 6;
  else
    m = 7;  // saturates: everything above 5 (inf included) is 6
  return sign | m;
}

float DecodeE2M1(uint8_t code) {
  const float v = kE2M1Magnitudes[code & 0x7];
  return (code & 0x8) ? -v : v;
}

uint8_t EncodeE4M3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kE4M3Max) return sign | 0x7E;
  constexpr float kMinNormal = 0x1p-6f;
  if (a < kMinNormal) {
    // Subnormals are multiples of 2^-9; rounding up to 8 · 2^-9 lands exactly on the
    // smallest normal, whose code is also 8.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int exp2 = 0;
  std::frexp(a, &exp2);  // a = f · 2^exp2, f in [0.5, 1)
  int e = exp2 - 1;      // a in [2^e, 2^(e+1))
  // 8..16 after rounding: the 3 mantissa bits plus the implicit one. Scaling by a power
  // of two is exact, and nearbyint rounds to nearest even in the default mode.
  int m = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));
  if (m == 16) {
    m = 8;
    ++e;
  }
  int code = ((e + 7) << 3) | (m - 8);
  if (code > 0x7E) code = 0x7E;  // would round to 480 (the NaN pattern): saturate
  return sign | static_cast<uint8_t>(code);
}

float DecodeE4M3(uint8_t code) {
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 0x7;
  float v;
  if (exp == 0xF && mant == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + mant), exp - 10);
  }
  return (code & 0x80) ? -v : v;
}

float DecodeE8M0(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

uint8_t E8M0CeilPow2(float y) {
  KVC_CHECK(y > 0) << "E8M0 scale of non-positive " << y;
  if (std::isinf(y)) return 254;
  // The reference's fast_round_scale: exponent bits, plus one when any mantissa bit is
  // set. y is always a normal number here (the callers floor it at 2^-126 or more).
  const uint32_t bits = std::bit_cast<uint32_t>(y);
  uint32_t e = (bits >> 23) & 0xFF;
  if ((bits & 0x7FFFFF) != 0) ++e;
  return static_cast<uint8_t>(e > 254 ? 254 : e);
}

const KvFormatSpec& SpecOf(KvFormat format) { return kSpecs[static_cast<int>(format)]; }

absl::Status ParseKvFormat(absl::string_view name, KvFormat* out) {
  for (KvFormat f : {KvFormat::kMainKv, KvFormat::kIndexK, KvFormat::kSwaKv}) {
    if (SpecOf(f).name == name) {
      *out = f;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV format \"", name, "\" (expected main, index or swa)"));
}

int64_t CodesBytes(KvFormat format, int64_t n) {
  CheckCount(format, n);
  return n * SpecOf(format).value_bits / 8;
}

int64_t ScalesBytes(KvFormat format, int64_t n) {
  CheckCount(format, n);
  return n / SpecOf(format).scale_block;
}

void Quantize(KvFormat f, std::span<const float> x, std::span<uint8_t> codes,
              std::span<uint8_t> scales) {
  const int64_t n = static_cast<int64_t>(x.size());
  KVC_CHECK(static_cast<int64_t>(codes.size()) == CodesBytes(f, n)) << "codes buffer size";
  KVC_CHECK(static_cast<int64_t>(scales.size()) == ScalesBytes(f, n)) << "scales buffer size";
  const int64_t block = SpecOf(f).scale_block;
  const bool fp4 = SpecOf(f).value_bits == 4;
  for (int64_t b = 0; b * block < n; ++b) {
    const float* xb = x.data() + b * block;
    const uint8_t scale_code = BlockScaleCode(f, BlockAmax(xb, block));
    const float s = ScaleValue(f, scale_code);
    scales[b] = scale_code;
    for (int64_t i = 0; i < block; ++i) {
      const int64_t at = b * block + i;
      const uint8_t code = ElementCode(f, xb[i], s);
      if (!fp4) {
        codes[at] = code;
      } else if (at % 2 == 0) {
        codes[at / 2] = code;  // low nibble = even element
      } else {
        codes[at / 2] |= static_cast<uint8_t>(code << 4);
      }
    }
  }
}

void Dequantize(KvFormat f, std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                std::span<float> out) {
  const int64_t n = static_cast<int64_t>(out.size());
  KVC_CHECK(static_cast<int64_t>(codes.size()) == CodesBytes(f, n)) << "codes buffer size";
  KVC_CHECK(static_cast<int64_t>(scales.size()) == ScalesBytes(f, n)) << "scales buffer size";
  const int64_t block = SpecOf(f).scale_block;
  const bool fp4 = SpecOf(f).value_bits == 4;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t code =
        fp4 ? static_cast<uint8_t>((codes[i / 2] >> (4 * (i % 2))) & 0xF) : codes[i];
    out[i] = ElementValue(f, code) * ScaleValue(f, scales[i / block]);
  }
}

void FakeQuantize(KvFormat f, std::span<float> x) {
  const int64_t block = SpecOf(f).scale_block;
  CheckCount(f, static_cast<int64_t>(x.size()));
  for (size_t b = 0; b < x.size(); b += block) {
    float* xb = x.data() + b;
    const float s = ScaleValue(f, BlockScaleCode(f, BlockAmax(xb, block)));
    for (int64_t i = 0; i < block; ++i) xb[i] = ElementValue(f, ElementCode(f, xb[i], s)) * s;
  }
}

}  // namespace kvc
