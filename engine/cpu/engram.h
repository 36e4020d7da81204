// Engram's gate of one stream copy, shared by the CPU engine (engine/model/model_layers.cc)
// and the CUDA kernel (kernels/row_ops_kernel.cu), so both compute the same bits: every
// operation one rounded IEEE operation (rounded.h) in the CPU's order, the sigmoid the
// shared cpu::SigmoidF. Header-only, for g++ (C++20) and nvcc (C++17).
//
// For a copy h (d values) with the n-gram memory's key K and the learned qw, kw (d each):
//   s = (Σ_i h_i·qw_i·kw_i·K_i) / rms(h) / rms(K) / √d   (double, in order; rms with 1e-20)
//   g = σ(sign(s)·√max(|s|, 1e-6)),   and the copy becomes h + g·V.
#pragma once

#include <math.h>
#include <stdint.h>

#include "engine/cpu/hyper_connections.h"
#include "engine/cpu/rounded.h"
#include "engine/spec/host_device.h"

namespace kvc::cpu {

KVC_HOST_DEVICE inline float EngramGate(const float* h, const float* qw, const float* kw,
                                        const float* K, int64_t d) {
  using rounded::Add;
  using rounded::Div;
  using rounded::Mul;
  using rounded::Sqrt;
  double dot = 0, hh = 0, kk = 0;
  for (int64_t i = 0; i < d; ++i) {
    const double hi = h[i], ki = K[i];
    dot = Add(dot, Mul(Mul(Mul(hi, static_cast<double>(qw[i])), static_cast<double>(kw[i])), ki));
    hh = Add(hh, Mul(hi, hi));
    kk = Add(kk, Mul(ki, ki));
  }
  const double n = static_cast<double>(d), eps = 1e-20;
  const double s =
      Div(Div(Div(dot, Sqrt(Add(Div(hh, n), eps))), Sqrt(Add(Div(kk, n), eps))), Sqrt(n));
  const double mag = Sqrt(fabs(s) < 1e-6 ? 1e-6 : fabs(s));  // std::max's choice
  return SigmoidF(static_cast<float>(Mul(s >= 0 ? 1.0 : -1.0, mag)));
}

// h (d values) += g·V, each value one rounded multiply and add.
KVC_HOST_DEVICE inline void EngramAdd(float* h, float g, const float* V, int64_t d) {
  for (int64_t i = 0; i < d; ++i) h[i] = rounded::Add(h[i], rounded::Mul(g, V[i]));
}

}  // namespace kvc::cpu
