// The tile both GEMM kernels compute (gemm_kernel.cu: consecutive rows; moe_kernel.cu: an
// expert's slots, rows gathered): kBm × kBn outputs of y = x · Wᵀ with W in the CPU's
// panel layout, 256 threads (16 × 16), each kTm × kTn outputs (rows ty + 16 i, columns
// tx + 16 j), staging kBk-deep slices of x and W in shared memory. The slices are consumed
// in increasing k, so each output is one __fmaf_rn chain over k from +0 — the CPU's bits.
// Device code only (C++17 for nvcc; the CPU emulation compiles it as C++).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda::gemm_tile {

constexpr int kPanel = 16;  // engine/cpu/gemm.h PackedMatrix::kPanel
constexpr int kTm = 2, kTn = 4, kBm = 16 * kTm, kBn = 16 * kTn, kBk = 32;
constexpr int kThreads = 256;

// The tile's shared memory (declared __shared__ by the kernel): the staged slices, and
// where each of its rows reads x (k floats) and writes y (n floats).
struct Shared {
  float xs[kBm][kBk + 1];
  float ws[kBk][kBn];
  const float* x_row[kBm];
  float* y_row[kBm];
};

// Rows [0, m) of the tile (m ≤ kBm; x_row and y_row filled for them and a barrier passed),
// columns [col0, col0 + kBn) ∩ [0, n).
__device__ inline void Compute(Shared& sh, int m, int64_t k, const float* __restrict__ panels,
                               int64_t n, int64_t col0) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t padded_n = (n + kPanel - 1) / kPanel * kPanel;
  float acc[kTm][kTn];
  for (int i = 0; i < kTm; ++i)
    for (int j = 0; j < kTn; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kBk) {
    const int depth = static_cast<int>(k - k0 < kBk ? k - k0 : kBk);
    for (int e = threadIdx.x; e < kBm * kBk; e += blockDim.x) {
      const int r = e / kBk, kk = e % kBk;
      sh.xs[r][kk] = (r < m && kk < depth) ? sh.x_row[r][k0 + kk] : 0.0f;
    }
    for (int e = threadIdx.x; e < kBk * kBn; e += blockDim.x) {
      const int kk = e / kBn, c = e % kBn;
      const int64_t gc = col0 + c;
      sh.ws[kk][c] = (gc < padded_n && kk < depth)
                         ? panels[(gc / kPanel) * k * kPanel + (k0 + kk) * kPanel + gc % kPanel]
                         : 0.0f;
    }
    __syncthreads();
    // Exactly `depth` steps: a padded step would turn an accumulator of −0 into +0.
    for (int kk = 0; kk < depth; ++kk) {
      float wv[kTn];
      for (int j = 0; j < kTn; ++j) wv[j] = sh.ws[kk][tx + 16 * j];
      for (int i = 0; i < kTm; ++i) {
        const float xv = sh.xs[ty + 16 * i][kk];
        for (int j = 0; j < kTn; ++j) acc[i][j] = __fmaf_rn(xv, wv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  for (int i = 0; i < kTm; ++i) {
    const int r = ty + 16 * i;
    if (r >= m) continue;
    for (int j = 0; j < kTn; ++j) {
      const int64_t gc = col0 + tx + 16 * j;
      if (gc < n) sh.y_row[r][gc] = acc[i][j];
    }
  }
}

}  // namespace kvc::cuda::gemm_tile
