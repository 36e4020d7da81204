// ExpF on eight floats at once (AVX2): the same bits as cpu::ExpF per lane. Each step of
// ExpF is one IEEE operation in double (multiply, add, round to integer, scale by 2^k, one
// rounding to float) and a vector instruction performs it per lane with the same rounding,
// so only the edge cases (NaN, overflow, underflow) need selecting afterwards.
// Host only: callers are functions built with target("avx2,fma") that check
// cpu::Avx2FmaInUse() first. No FMA instruction is used here (ExpF never fuses).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine/cpu/exp.h"

namespace kvc::cpu {

__attribute__((target("avx2,fma"))) inline __m256d ExpReducedTimes2k4(__m128 x4) {
  const __m256d x = _mm256_cvtps_pd(x4);
  using namespace exp_detail;  // ExpF's constants: the same numbers, by construction
  const __m256d k = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(kLog2e)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // x + (−a) is x − a in IEEE arithmetic, signed zeros included.
  const __m256d r = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(k, _mm256_set1_pd(kLn2Hi))),
                                  _mm256_mul_pd(k, _mm256_set1_pd(kLn2Lo)));
  __m256d p = _mm256_set1_pd(TaylorCoefficient<0>());
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<1>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<2>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<3>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<4>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<5>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<6>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<7>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<8>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<9>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<10>()));
  p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(TaylorCoefficient<11>()));
  static_assert(kTaylorTerms == 12, "one line per coefficient above");
  // 2^k from exponent bits (k in [-150, 128] wherever the lane is in range).
  const __m256i k64 = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k));
  const __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(k64, _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
}

// out[i] = ExpF(x[i]) for eight lanes, bit for bit.
__attribute__((target("avx2,fma"))) inline __m256 ExpF8(__m256 x) {
  const __m128 lo = _mm256_cvtpd_ps(ExpReducedTimes2k4(_mm256_castps256_ps128(x)));
  const __m128 hi = _mm256_cvtpd_ps(ExpReducedTimes2k4(_mm256_extractf128_ps(x, 1)));
  __m256 y = _mm256_set_m128(hi, lo);
  // ExpF's edges, in its order: NaN stays itself, above log(FLT_MAX) +inf, below −104 zero.
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(),
                       _mm256_cmp_ps(x, _mm256_set1_ps(exp_detail::kZeroBelow), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_huge_valf()),
                       _mm256_cmp_ps(x, _mm256_set1_ps(exp_detail::kInfAbove), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

}  // namespace kvc::cpu
