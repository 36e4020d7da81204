#include "engine/spec/kv_codec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "engine/spec/fp_codes.h"

namespace kvc {
namespace {

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;

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

uint8_t EncodeE2M1(float x) { return static_cast<uint8_t>(fp::EncodeE2M1(x)); }

float DecodeE2M1(uint8_t code) { return fp::DecodeE2M1(code); }

uint8_t EncodeE4M3(float x) { return static_cast<uint8_t>(fp::EncodeE4M3(x)); }

float DecodeE4M3(uint8_t code) { return fp::DecodeE4M3(code); }

float DecodeE8M0(uint8_t code) { return fp::DecodeE8M0(code); }

uint8_t E8M0CeilPow2(float y) {
  KVC_CHECK(y > 0) << "E8M0 scale of non-positive " << y;
  return static_cast<uint8_t>(fp::E8M0CeilPow2(y));
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
