// The mHC (manifold-constrained hyper-connections) math of one row, shared by the CPU
// engine (engine/cpu/ops.cc, engine/model/model_layers.cc) and the CUDA kernels
// (kernels/row_ops_kernel.cu), so both compute the same bits: every operation is one
// rounded IEEE operation (rounded.h) in the CPU's order, and the exponentials are the
// shared cpu::ExpF. Header-only, for g++ (C++20) and nvcc (C++17).
//
// A sublayer with hc copies of the residual stream X (hc × d per row):
// - its mixes m = (hc_fn · vec X) · HcMixesScale(vec X), (2 + hc)·hc values per row;
// - HcCoefficientsOf turns them into pre (hc), post (hc) and comb (hc × hc, Sinkhorn);
// - the sublayer's input is HcPreAt (Σ_j pre[j]·X[j]), its output f goes back into the
//   stream as HcPostAt (post[k]·f + Σ_j comb[j][k]·X[j]).
#pragma once

#include <math.h>
#include <stdint.h>

#include "engine/cpu/exp.h"
#include "engine/cpu/rounded.h"
#include "engine/spec/host_device.h"

namespace kvc::cpu {

// 1 / (1 + e^-x).
KVC_HOST_DEVICE inline float SigmoidF(float x) {
  return rounded::Div(1.0f, rounded::Add(1.0f, ExpF(-x)));
}

// 1 / sqrt(mean(x²) + 1e-20) over the n values of x, accumulated in double in order: the
// factor a row's mixes are scaled by.
KVC_HOST_DEVICE inline float HcMixesScale(const float* x, int64_t n) {
  using rounded::Add;
  using rounded::Mul;
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    ss = Add(ss, Mul(v, v));
  }
  return static_cast<float>(
      rounded::Div(1.0, rounded::Sqrt(Add(rounded::Div(ss, static_cast<double>(n)), 1e-20))));
}

// One row's mixes [mix] (hc_fn · vec X, fresh from the product) times HcMixesScale of its
// row of the stream x [n]: the mixes HcCoefficientsOf takes.
KVC_HOST_DEVICE inline void HcScaleMixesRow(const float* x, int64_t n, float* mixes, int64_t mix) {
  const float rs = HcMixesScale(x, n);
  for (int64_t j = 0; j < mix; ++j) mixes[j] = rounded::Mul(mixes[j], rs);
}

// pre, post and comb from one row's (already scaled) mixes m [(2 + hc)·hc], the learned
// base [(2 + hc)·hc] and scale [3]: pre = σ(m·s0 + b) + eps, post = 2σ(m·s1 + b), comb =
// a row softmax of m·s2 + b (+ eps), then Sinkhorn — columns, and (iters − 1) times rows
// then columns, each divided by its sum + eps.
KVC_HOST_DEVICE inline void HcCoefficientsOf(const float* m, const float* base, const float* scale,
                                             int64_t hc, int64_t iters, float eps, float* pre,
                                             float* post, float* comb) {
  using rounded::Add;
  using rounded::Div;
  using rounded::Mul;
  for (int64_t j = 0; j < hc; ++j) {
    pre[j] = Add(SigmoidF(Add(Mul(m[j], scale[0]), base[j])), eps);
    post[j] = Mul(2.0f, SigmoidF(Add(Mul(m[hc + j], scale[1]), base[hc + j])));
  }
  float* C = comb;
  for (int64_t j = 0; j < hc; ++j) {
    float mx = -HUGE_VALF;
    for (int64_t k = 0; k < hc; ++k) {
      C[j * hc + k] = Add(Mul(m[2 * hc + j * hc + k], scale[2]), base[2 * hc + j * hc + k]);
      mx = mx < C[j * hc + k] ? C[j * hc + k] : mx;
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) {
      C[j * hc + k] = ExpF(Add(C[j * hc + k], -mx));
      sum = Add(sum, C[j * hc + k]);
    }
    for (int64_t k = 0; k < hc; ++k) C[j * hc + k] = Add(Div(C[j * hc + k], sum), eps);
  }
  for (int64_t it = 0; it < (iters > 1 ? iters : 1); ++it) {
    if (it > 0) {  // rows, then columns; the first step normalizes columns only
      for (int64_t j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int64_t k = 0; k < hc; ++k) s = Add(s, C[j * hc + k]);
        for (int64_t k = 0; k < hc; ++k) C[j * hc + k] = Div(C[j * hc + k], Add(s, eps));
      }
    }
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int64_t j = 0; j < hc; ++j) s = Add(s, C[j * hc + k]);
      for (int64_t j = 0; j < hc; ++j) C[j * hc + k] = Div(C[j * hc + k], Add(s, eps));
    }
  }
}

// Value i of the sublayer's input: Σ_j a[j]·X[j·d + i], j in order from +0.
KVC_HOST_DEVICE inline float HcPreAt(const float* X, const float* a, int64_t hc, int64_t d,
                                     int64_t i) {
  float s = 0.0f;
  for (int64_t j = 0; j < hc; ++j) s = rounded::Add(s, rounded::Mul(a[j], X[j * d + i]));
  return s;
}

// Value i of the mean of the hc copies (what the drafter reads of a layer's input):
// Σ_j X[j·d + i], j in order from +0, then / hc.
KVC_HOST_DEVICE inline float HcMeanAt(const float* X, int64_t hc, int64_t d, int64_t i) {
  float s = 0.0f;
  for (int64_t j = 0; j < hc; ++j) s = rounded::Add(s, X[j * d + i]);
  return rounded::Div(s, static_cast<float>(hc));
}

// Value i of copy k of the stream after the sublayer: post[k]·f[i] + Σ_j comb[j][k]·R[j·d + i].
KVC_HOST_DEVICE inline float HcPostAt(const float* f, const float* R, const float* post,
                                      const float* comb, int64_t hc, int64_t d, int64_t k,
                                      int64_t i) {
  float s = rounded::Mul(post[k], f[i]);
  for (int64_t j = 0; j < hc; ++j)
    s = rounded::Add(s, rounded::Mul(comb[j * hc + k], R[j * d + i]));
  return s;
}

}  // namespace kvc::cpu
