#include <cmath>

#include "engine/cpu/engram.h"
#include "engine/cpu/exp.h"
#include "engine/cpu/hyper_connections.h"
#include "kernels/row_math.cuh"
#include "kernels/row_ops_kernel.cuh"

namespace kvc::cuda {
namespace {

constexpr int kThreads = 128;

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void RmsNormKernel(const float* x, const float* w, int64_t rows, int64_t n, double eps,
                              float* y) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < rows) RmsNormRow(x + r * n, w, n, eps, y + r * n);
}

__global__ void PoolGroupsKernel(const float* kv, const float* score, int64_t groups, int64_t ratio,
                                 int64_t dim, float* out) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= groups * dim) return;
  const int64_t g = id / dim, ch = id % dim;
  const float* k = kv + g * ratio * dim;
  const float* s = score + g * ratio * dim;
  float mx = -INFINITY;
  for (int64_t t = 0; t < ratio; ++t) mx = fmaxf(mx, s[t * dim + ch]);
  float den = 0.0f;
  for (int64_t t = 0; t < ratio; ++t)
    den = __fadd_rn(den, cpu::ExpF(__fsub_rn(s[t * dim + ch], mx)));
  float acc = 0.0f;
  for (int64_t t = 0; t < ratio; ++t) {
    acc = __fadd_rn(
        acc, __fmul_rn(k[t * dim + ch], __fdiv_rn(cpu::ExpF(__fsub_rn(s[t * dim + ch], mx)), den)));
  }
  out[id] = acc;
}

__global__ void ExpFKernel(const float* x, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = cpu::ExpF(x[i]);
}

__global__ void TurnTailsKernel(float* x, int64_t rows, int64_t heads, int64_t dim,
                                const float* turns, int64_t half) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * heads * half) return;
  const int64_t i = id % half, rh = id / half, r = rh / heads;
  float* t = x + rh * dim + dim - 2 * half;
  TurnPair(t + 2 * i, turns[(r * half + i) * 2], turns[(r * half + i) * 2 + 1]);
}

__global__ void SwapOuterKernel(const float* x, int64_t outer, int64_t middle, int64_t inner,
                                float* y) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= outer * middle * inner) return;
  const int64_t c = id % inner, b = (id / inner) % middle, a = id / (inner * middle);
  y[(b * outer + a) * inner + c] = x[id];
}

__global__ void HcKernel(const float* m, const float* base, const float* scale, int64_t rows,
                         int hc, int iters, float eps, float* pre, float* post, float* comb) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  cpu::HcCoefficientsOf(m + r * (2 + hc) * hc, base, scale, hc, iters, eps, pre + r * hc,
                        post + r * hc, comb + r * hc * hc);
}

__global__ void HcScaleMixesKernel(const float* x, int64_t rows, int64_t n, float* mixes,
                                   int64_t mix) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  cpu::HcScaleMixesRow(x + r * n, n, mixes + r * mix, mix);
}

__global__ void HcPreKernel(const float* X, const float* a, int64_t rows, int64_t hc, int64_t d,
                            float* out) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * d) return;
  const int64_t r = id / d, i = id % d;
  out[id] = cpu::HcPreAt(X + r * hc * d, a + r * hc, hc, d, i);
}

__global__ void HcMeanKernel(const float* X, int64_t rows, int64_t hc, int64_t d, float* out,
                             int64_t out_stride) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * d) return;
  const int64_t r = id / d, i = id % d;
  out[r * out_stride + i] = cpu::HcMeanAt(X + r * hc * d, hc, d, i);
}

__global__ void HcPostKernel(const float* f, const float* R, const float* post, const float* comb,
                             int64_t rows, int64_t hc, int64_t d, float* out) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * hc * d) return;
  const int64_t r = id / (hc * d), k = (id / d) % hc, i = id % d;
  out[id] =
      cpu::HcPostAt(f + r * d, R + r * hc * d, post + r * hc, comb + r * hc * hc, hc, d, k, i);
}

__global__ void EngramGateKernel(float* X, const float* KV, const float* qw, const float* kw,
                                 int64_t rows, int64_t hc, int64_t d) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * hc) return;
  const int64_t r = id / hc, k = id % hc;
  float* h = X + (r * hc + k) * d;
  const float* K = KV + (r * (hc + 1) + k) * d;
  const float* V = KV + (r * (hc + 1) + hc) * d;
  cpu::EngramAdd(h, cpu::EngramGate(h, qw + k * d, kw + k * d, K, d), V, d);
}

}  // namespace

cudaError_t LaunchEngramGate(float* X, const float* KV, const float* qw, const float* kw,
                             int64_t rows, int64_t hc, int64_t d, cudaStream_t stream) {
  if (rows * hc == 0) return cudaSuccess;
  EngramGateKernel<<<Blocks(rows * hc), kThreads, 0, stream>>>(X, KV, qw, kw, rows, hc, d);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const float* w, int64_t rows, int64_t n, double eps,
                          float* y, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormKernel<<<Blocks(rows), kThreads, 0, stream>>>(x, w, rows, n, eps, y);
  return cudaGetLastError();
}

cudaError_t LaunchTurnTails(float* x, int64_t rows, int64_t heads, int64_t dim, const float* turns,
                            int64_t half, cudaStream_t stream) {
  if (half < 0 || 2 * half > dim) return cudaErrorInvalidValue;
  if (rows * heads * half == 0) return cudaSuccess;
  TurnTailsKernel<<<Blocks(rows * heads * half), kThreads, 0, stream>>>(x, rows, heads, dim, turns,
                                                                        half);
  return cudaGetLastError();
}

cudaError_t LaunchSwapOuterAxes(const float* x, int64_t outer, int64_t middle, int64_t inner,
                                float* y, cudaStream_t stream) {
  if (outer * middle * inner == 0) return cudaSuccess;
  SwapOuterKernel<<<Blocks(outer * middle * inner), kThreads, 0, stream>>>(x, outer, middle, inner,
                                                                           y);
  return cudaGetLastError();
}

cudaError_t LaunchPoolGroups(const float* kv, const float* score, int64_t groups, int64_t ratio,
                             int64_t dim, float* out, cudaStream_t stream) {
  if (groups == 0) return cudaSuccess;
  PoolGroupsKernel<<<Blocks(groups * dim), kThreads, 0, stream>>>(kv, score, groups, ratio, dim,
                                                                  out);
  return cudaGetLastError();
}

cudaError_t LaunchHcCoefficients(const float* m, const float* base, const float* scale,
                                 int64_t rows, int hc, int iters, float eps, float* pre,
                                 float* post, float* comb, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  HcKernel<<<Blocks(rows), kThreads, 0, stream>>>(m, base, scale, rows, hc, iters, eps, pre, post,
                                                  comb);
  return cudaGetLastError();
}

cudaError_t LaunchHcScaleMixes(const float* x, int64_t rows, int64_t n, float* mixes, int64_t mix,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  HcScaleMixesKernel<<<Blocks(rows), kThreads, 0, stream>>>(x, rows, n, mixes, mix);
  return cudaGetLastError();
}

cudaError_t LaunchHcPre(const float* X, const float* a, int64_t rows, int64_t hc, int64_t d,
                        float* out, cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  HcPreKernel<<<Blocks(rows * d), kThreads, 0, stream>>>(X, a, rows, hc, d, out);
  return cudaGetLastError();
}

cudaError_t LaunchHcMean(const float* X, int64_t rows, int64_t hc, int64_t d, float* out,
                         int64_t out_stride, cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  HcMeanKernel<<<Blocks(rows * d), kThreads, 0, stream>>>(X, rows, hc, d, out, out_stride);
  return cudaGetLastError();
}

cudaError_t LaunchHcPost(const float* f, const float* R, const float* post, const float* comb,
                         int64_t rows, int64_t hc, int64_t d, float* out, cudaStream_t stream) {
  if (rows * hc * d == 0) return cudaSuccess;
  HcPostKernel<<<Blocks(rows * hc * d), kThreads, 0, stream>>>(f, R, post, comb, rows, hc, d, out);
  return cudaGetLastError();
}

cudaError_t LaunchExpF(const float* x, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ExpFKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
