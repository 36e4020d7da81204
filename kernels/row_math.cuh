// Per-row arithmetic shared by the device kernels that normalize and turn rows (the
// row ops' own kernels and the fused finish of a product's result): the CPU's operation
// order and rounding (engine/cpu/ops.h), so every kernel using them gives its bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvc::cuda {

// y = x · rsqrt(mean(x²) + eps) · w over n values (double accumulation in index order, as
// cpu::RmsNorm). y may be x.
__device__ __forceinline__ void RmsNormRow(const float* x, const float* w, int64_t n, double eps,
                                           float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss = __dadd_rn(ss, __dmul_rn(static_cast<double>(x[i]), x[i]));
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = __fmul_rn(__fmul_rn(x[i], inv), w[i]);
}

// The pair (p[0], p[1]) turned by the angle whose cos and sin are c, s (cpu::ApplyRope's
// arithmetic with the CPU's cos/sin).
__device__ __forceinline__ void TurnPair(float* p, float c, float s) {
  const float a = p[0], b = p[1];
  p[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  p[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

}  // namespace kvc::cuda
