// SwiGlu: one element of the MoE experts' gated activation with the same bits on the CPU
// and on a GPU (header-only, for g++ C++20 and nvcc C++17, like exp.h):
//   weight · silu(min(g, limit)) · clamp(u, −limit, limit),  silu(x) = x · 1 / (1 + e^−x),
// evaluated in exactly that order with the shared cpu::ExpF, each operation rounded once
// (on the device the explicit __f*_rn intrinsics forbid contraction; on the host ISO C++
// does not contract). The min and clamp are std::min's and std::clamp's comparisons
// written out, so a NaN passes through as on the CPU (fminf would drop it).
#pragma once

#include "engine/cpu/exp.h"
#include "engine/spec/host_device.h"

namespace kvc::cpu {
namespace swiglu_detail {

KVC_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KVC_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KVC_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace swiglu_detail

KVC_HOST_DEVICE inline float SwiGlu(float g, float u, float limit, float weight) {
  using swiglu_detail::Add;
  using swiglu_detail::Div;
  using swiglu_detail::Mul;
  const float gi = limit < g ? limit : g;                          // std::min(g, limit)
  const float ui = u < -limit ? -limit : (limit < u ? limit : u);  // std::clamp
  const float sigmoid = Div(1.0f, Add(1.0f, ExpF(-gi)));
  return Mul(Mul(weight, Mul(gi, sigmoid)), ui);
}

}  // namespace kvc::cpu
