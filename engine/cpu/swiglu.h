// SwiGlu: one element of the MoE experts' gated activation with the same bits on the CPU
// and on a GPU (header-only, for g++ C++20 and nvcc C++17, like exp.h):
//   weight · silu(min(g, limit)) · clamp(u, −limit, limit),  silu(x) = x · 1 / (1 + e^−x),
// evaluated in exactly that order with the shared cpu::ExpF, each operation rounded once
// (on the device the explicit __f*_rn intrinsics forbid contraction; on the host ISO C++
// does not contract). The min and clamp are std::min's and std::clamp's comparisons
// written out, so a NaN passes through as on the CPU (fminf would drop it).
#pragma once

#include "engine/cpu/exp.h"
#include "engine/cpu/rounded.h"
#include "engine/spec/host_device.h"

namespace kvc::cpu {
KVC_HOST_DEVICE inline float SwiGlu(float g, float u, float limit, float weight) {
  using rounded::Add;
  using rounded::Div;
  using rounded::Mul;
  const float gi = limit < g ? limit : g;                          // std::min(g, limit)
  const float ui = u < -limit ? -limit : (limit < u ? limit : u);  // std::clamp
  const float sigmoid = Div(1.0f, Add(1.0f, ExpF(-gi)));
  return Mul(Mul(weight, Mul(gi, sigmoid)), ui);
}

}  // namespace kvc::cpu
