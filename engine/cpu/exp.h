// ExpF: e^x in float with the same bits on the CPU and on a GPU. Header-only and written
// for both compilers (g++ C++20 and nvcc C++17): every double operation is a separate
// multiply or add, never fused — on the host ISO C++ does not contract, on the device the
// explicit __dmul_rn/__dadd_rn forbid it — so the softmax of the engine's attention and
// compressor pooling can be computed bit for bit alike by its CPU code and its kernels.
// (The C library's expf differs from CUDA's by up to 2 ulp, and between libm builds.)
//
// Accuracy: x = k·ln2 + r with |r| <= ln2/2 (Cody–Waite, ln2 in two parts), e^r by its
// Taylor series to r^11 (truncation < 3e-13 relative) in double, then 2^k exactly and one
// rounding to float: within 1 ulp, correctly rounded except within ~1e-12 of a tie.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/cpu/rounded.h"
#include "engine/spec/host_device.h"

namespace kvc::cpu {

namespace exp_detail {

// ExpF's constants, shared with ExpF8 (engine/cpu/exp_avx2.h) so that the two cannot drift.
// Namespace-scope scalars and a constexpr function: both usable in nvcc's device code, where
// a constexpr array is not.
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2Hi = 0.6931471803691238;  // 0x3fe62e42fee00000: k·kLn2Hi is exact
constexpr double kLn2Lo = 1.9082149292705877e-10;
constexpr float kInfAbove = 88.72283935546875f;  // log(FLT_MAX)
constexpr float kZeroBelow = -104.0f;            // below half the least subnormal
constexpr int kTaylorTerms = 12;
// e^r's Taylor coefficients in Horner order: 1/11!, 1/10!, …, 1/1!, 1/0!. The index is a
// template argument, so one past the last term fails to compile instead of returning a number.
template <int I>
KVC_HOST_DEVICE constexpr double TaylorCoefficient() {
  static_assert(I >= 0 && I < kTaylorTerms, "e^r has kTaylorTerms coefficients");
  return I == 0   ? 2.505210838544172e-08
         : I == 1 ? 2.755731922398589e-07
         : I == 2 ? 2.7557319223985893e-06
         : I == 3 ? 2.48015873015873e-05
         : I == 4 ? 0.0001984126984126984
         : I == 5 ? 0.001388888888888889
         : I == 6 ? 0.008333333333333333
         : I == 7 ? 0.041666666666666664
         : I == 8 ? 0.16666666666666666
         : I == 9 ? 0.5
                  : 1.0;  // I == 10, 11: 1/1! and 1/0!
}

// e^x = p · 2^k for x in ExpF's finite range: k = rint(x·log2 e) (an integer in
// [-150, 128]) and p = e^r, r = x − k·ln2.
KVC_HOST_DEVICE inline double Reduced(float x, double* k_out) {
  using rounded::Add;
  using rounded::Mul;
  const double xd = x;
  const double k = rint(Mul(xd, kLog2e));
  const double r = Add(Add(xd, -Mul(k, kLn2Hi)), -Mul(k, kLn2Lo));
  // Written out rather than looped: g++ -O2 keeps a 12-step loop rolled, with a table load
  // per step, in the attention's softmax.
  double p = TaylorCoefficient<0>();
  p = Add(Mul(p, r), TaylorCoefficient<1>());
  p = Add(Mul(p, r), TaylorCoefficient<2>());
  p = Add(Mul(p, r), TaylorCoefficient<3>());
  p = Add(Mul(p, r), TaylorCoefficient<4>());
  p = Add(Mul(p, r), TaylorCoefficient<5>());
  p = Add(Mul(p, r), TaylorCoefficient<6>());
  p = Add(Mul(p, r), TaylorCoefficient<7>());
  p = Add(Mul(p, r), TaylorCoefficient<8>());
  p = Add(Mul(p, r), TaylorCoefficient<9>());
  p = Add(Mul(p, r), TaylorCoefficient<10>());
  p = Add(Mul(p, r), TaylorCoefficient<11>());
  static_assert(kTaylorTerms == 12, "one line per coefficient above");
  *k_out = k;
  return p;
}

// p · 2^k rounded once to float, k an integer in [-150, 128].
KVC_HOST_DEVICE inline float TimesPowerOfTwo(double p, double k) {
#if defined(__CUDA_ARCH__)
  return static_cast<float>(ldexp(p, static_cast<int>(k)));
#else
  // 2^k built from its exponent bits is a normal double for every such k, so the product
  // is exact — the same bits as ldexp's, without glibc's ldexp call (a tenth of a resume's
  // CPU time, in the attention's softmax).
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(k) + 1023) << 52;
  double two_k;
  memcpy(&two_k, &bits, sizeof two_k);
  return static_cast<float>(rounded::Mul(p, two_k));
#endif
}

}  // namespace exp_detail

KVC_HOST_DEVICE inline float ExpF(float x) {
  if (!(x == x)) return x;  // NaN
  if (x > exp_detail::kInfAbove) return HUGE_VALF;
  if (x < exp_detail::kZeroBelow) return 0.0f;
  double k;
  const double p = exp_detail::Reduced(x, &k);
  return exp_detail::TimesPowerOfTwo(p, k);
}

}  // namespace kvc::cpu
