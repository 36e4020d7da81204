// Log1pF and SqrtSoftplus: the MoE router's score, sqrt(log(1 + e^x)), with the same bits
// on the CPU and on a GPU (header-only, for g++ C++20 and nvcc C++17, like exp.h). The C
// library's log1pf and CUDA's differ in the last bit, so a router on the device would pick
// other experts at near-ties than the CPU's; this one is written once for both compilers
// with every double operation separate (explicit __d*_rn on the device).
//
// Accuracy: log(1 + x) in double — a series for |x| < 2^-10; otherwise 1 + x (exact in
// double for every float x > −1 up to 2^29, and within 2^-53 beyond) split as m·2^k with
// m in [√½, √2), log m = 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.172, by its series to
// s^23 — then one rounding to float: within 1 ulp, correctly rounded except within ~1e-15
// of a tie.
#pragma once

#include <math.h>

#include "engine/cpu/exp.h"
#include "engine/cpu/rounded.h"
#include "engine/spec/host_device.h"

namespace kvc::cpu {
KVC_HOST_DEVICE inline float Log1pF(float x) {
  using rounded::Add;
  using rounded::Div;
  using rounded::Mul;
  if (!(x == x) || x == HUGE_VALF) return x;  // NaN, +inf
  if (x == -1.0f) return -HUGE_VALF;
  if (x < -1.0f) return NAN;
  const double xd = x;
  if (fabs(xd) < 0.0009765625) {  // 2^-10: x − x²/2 + x³/3 − … to x^6
    double p = -0.16666666666666666;
    p = Add(Mul(p, xd), 0.2);
    p = Add(Mul(p, xd), -0.25);
    p = Add(Mul(p, xd), 0.3333333333333333);
    p = Add(Mul(p, xd), -0.5);
    p = Add(Mul(p, xd), 1.0);
    return static_cast<float>(Mul(p, xd));
  }
  int k = 0;
  double m = frexp(Add(1.0, xd), &k);  // [0.5, 1)
  if (m < 0.7071067811865476) {
    m = Mul(m, 2.0);
    k -= 1;
  }
  const double s = Div(Add(m, -1.0), Add(m, 1.0)), s2 = Mul(s, s);
  double p = 0.043478260869565216;  // 1/23
  p = Add(Mul(p, s2), 0.047619047619047616);
  p = Add(Mul(p, s2), 0.05263157894736842);
  p = Add(Mul(p, s2), 0.058823529411764705);
  p = Add(Mul(p, s2), 0.06666666666666667);
  p = Add(Mul(p, s2), 0.07692307692307693);
  p = Add(Mul(p, s2), 0.09090909090909091);
  p = Add(Mul(p, s2), 0.1111111111111111);
  p = Add(Mul(p, s2), 0.14285714285714285);
  p = Add(Mul(p, s2), 0.2);
  p = Add(Mul(p, s2), 0.3333333333333333);
  p = Add(Mul(p, s2), 1.0);
  const double ln2 = 0.6931471805599453;
  return static_cast<float>(Add(Mul(static_cast<double>(k), ln2), Mul(Mul(2.0, s), p)));
}

// sqrt(softplus(x)), softplus(x) = log(1 + e^x), taken as x above 20 (no overflow there).
KVC_HOST_DEVICE inline float SqrtSoftplus(float x) {
  return rounded::Sqrt(x > 20.0f ? x : Log1pF(ExpF(x)));
}

}  // namespace kvc::cpu
