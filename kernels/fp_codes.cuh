// Device-side FP4/FP8 element and scale codes, shared by the kernels. The same rules as
// the CPU codec (engine/spec/kv_codec.h), written with CUDA's math functions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvc::cuda {

__device__ __forceinline__ float E2M1Value(uint32_t code) {
  // Magnitudes of codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6: subnormal m·0.5 for m < 2,
  // else (1 + 0.5·(m & 1))·2^((m >> 1) − 1), built from the bits (a table indexed at run
  // time would live in local memory). Bit 3 is the sign (code 8 is −0).
  const uint32_t m = code & 7u;
  const float v = m < 2u ? 0.5f * static_cast<float>(m)
                         : __uint_as_float((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
  return (code & 8u) ? -v : v;
}

__device__ __forceinline__ float E4M3Value(uint32_t code) {
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 7;
  float v;
  if (exp == 0xF && mant == 7) {
    v = __int_as_float(0x7FC00000);  // NaN
  } else if (exp == 0) {
    v = ldexpf(static_cast<float>(mant), -9);
  } else {
    v = ldexpf(static_cast<float>(8 + mant), exp - 10);
  }
  return (code & 0x80u) ? -v : v;
}

__device__ __forceinline__ float E8M0Value(uint32_t code) {
  if (code == 0xFF) return __int_as_float(0x7FC00000);
  return ldexpf(1.0f, static_cast<int>(code) - 127);
}

}  // namespace kvc::cuda
