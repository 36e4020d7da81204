// The FP4 (E2M1) and FP8 (E4M3) element codes and the E4M3 / E8M0 scale codes of the
// stored KV formats, one definition for the CPU codec (kv_codec.cc) and the CUDA kernels
// (kernels/fp_codes.cuh), so the two cannot drift apart. Written for both compilers (g++
// C++20, nvcc C++17): C math functions only, every rounding explicit, no tables (a table
// indexed at run time would live in a kernel's local memory).
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "engine/spec/host_device.h"

namespace kvc::fp {

KVC_HOST_DEVICE inline uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

KVC_HOST_DEVICE inline float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

constexpr uint32_t kQuietNanBits = 0x7FC00000u;

// Nearest E2M1 code of x (|x| <= 6 expected; larger saturates to ±6); at an exact tie the
// even code wins. NaN → +0. Bit 3 is the sign.
KVC_HOST_DEVICE inline uint32_t EncodeE2M1(float x) {
  if (isnan(x)) return 0;
  const uint32_t sign = signbit(x) ? 0x8u : 0x0u;
  const float a = fabsf(x);
  // Midpoints between neighbours: <= where the lower code is even, < where it is odd.
  uint32_t m;
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
    m = 7;  // everything above 5 (inf included) is 6
  return sign | m;
}

// Magnitudes of codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6 — subnormal m·0.5 for m < 2, else
// (1 + 0.5·(m & 1))·2^((m >> 1) − 1), built from the bits. Code 8 is −0.
KVC_HOST_DEVICE inline float DecodeE2M1(uint32_t code) {
  const uint32_t m = code & 7u;
  const float v = m < 2u ? 0.5f * static_cast<float>(m)
                         : BitsFloat((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
  return (code & 8u) ? -v : v;
}

// Nearest E4M3 (FN: no inf, 0x7F is NaN) code of x, ties to even; |x| >= 448 saturates
// to ±448; NaN → 0x7F.
KVC_HOST_DEVICE inline uint32_t EncodeE4M3(float x) {
  if (isnan(x)) return 0x7Fu;
  const uint32_t sign = signbit(x) ? 0x80u : 0x00u;
  const float a = fabsf(x);
  if (a >= 448.0f) return sign | 0x7Eu;
  if (a < 0x1p-6f) {
    // Subnormals are multiples of 2^-9; rounding up to 8 · 2^-9 lands exactly on the
    // smallest normal, whose code is also 8.
    return sign | static_cast<uint32_t>(nearbyintf(a * 512.0f));
  }
  int exp2 = 0;
  frexpf(a, &exp2);  // a = f · 2^exp2, f in [0.5, 1)
  int e = exp2 - 1;  // a in [2^e, 2^(e+1))
  // 8..16 after rounding: the 3 mantissa bits plus the implicit one. Scaling by a power of
  // two is exact, and nearbyintf rounds to nearest even in the default mode.
  int m = static_cast<int>(nearbyintf(ldexpf(a, 3 - e)));
  if (m == 16) {
    m = 8;
    ++e;
  }
  int code = ((e + 7) << 3) | (m - 8);
  if (code > 0x7E) code = 0x7E;  // would round to 480 (the NaN pattern): saturate
  return sign | static_cast<uint32_t>(code);
}

KVC_HOST_DEVICE inline float DecodeE4M3(uint32_t code) {
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 7;
  float v;
  if (exp == 0xF && mant == 7) {
    v = BitsFloat(kQuietNanBits);
  } else if (exp == 0) {
    v = ldexpf(static_cast<float>(mant), -9);
  } else {
    v = ldexpf(static_cast<float>(8 + mant), exp - 10);
  }
  return (code & 0x80u) ? -v : v;
}

KVC_HOST_DEVICE inline float DecodeE8M0(uint32_t code) {
  if (code == 0xFFu) return BitsFloat(kQuietNanBits);
  return ldexpf(1.0f, static_cast<int>(code) - 127);
}

// The E8M0 code of the smallest power of two >= y (y > 0 and normal; the reference's
// fast_round_scale: the exponent bits, plus one when any mantissa bit is set); inf and
// anything past 2^127 give 254.
KVC_HOST_DEVICE inline uint32_t E8M0CeilPow2(float y) {
  if (isinf(y)) return 254u;
  const uint32_t bits = FloatBits(y);
  uint32_t e = (bits >> 23) & 0xFFu;
  if ((bits & 0x7FFFFFu) != 0) ++e;
  return e > 254u ? 254u : e;
}

}  // namespace kvc::fp
