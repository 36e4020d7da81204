#include "kernels/gemm_kernel.cuh"

namespace kvc::cuda {
namespace {

constexpr int kPanel = 16;  // engine/cpu/gemm.h PackedMatrix::kPanel
// A block computes a kBm × kBn tile of y with 16 × 16 threads, each kTm × kTn outputs
// (rows ty + 16 i, columns tx + 16 j), staging kBk-deep slices of x and W in shared
// memory. The slices are consumed in increasing k, so each output's chain is the CPU's.
constexpr int kTm = 2, kTn = 4, kBm = 16 * kTm, kBn = 16 * kTn, kBk = 32;

__global__ void GemmKernel(const float* __restrict__ x, int64_t m, int64_t k,
                           const float* __restrict__ panels, int64_t n, float* __restrict__ y) {
  __shared__ float xs[kBm][kBk + 1];
  __shared__ float ws[kBk][kBn];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBm;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBn;
  const int64_t padded_n = (n + kPanel - 1) / kPanel * kPanel;
  float acc[kTm][kTn];
  for (int i = 0; i < kTm; ++i)
    for (int j = 0; j < kTn; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kBk) {
    const int depth = static_cast<int>(k - k0 < kBk ? k - k0 : kBk);
    for (int e = threadIdx.x; e < kBm * kBk; e += blockDim.x) {
      const int r = e / kBk, kk = e % kBk;
      const int64_t gr = row0 + r;
      xs[r][kk] = (gr < m && kk < depth) ? x[gr * k + k0 + kk] : 0.0f;
    }
    for (int e = threadIdx.x; e < kBk * kBn; e += blockDim.x) {
      const int kk = e / kBn, c = e % kBn;
      const int64_t gc = col0 + c;
      ws[kk][c] = (gc < padded_n && kk < depth)
                      ? panels[(gc / kPanel) * k * kPanel + (k0 + kk) * kPanel + gc % kPanel]
                      : 0.0f;
    }
    __syncthreads();
    // Exactly `depth` steps: a padded step would turn an accumulator of −0 into +0.
    for (int kk = 0; kk < depth; ++kk) {
      float wv[kTn];
      for (int j = 0; j < kTn; ++j) wv[j] = ws[kk][tx + 16 * j];
      for (int i = 0; i < kTm; ++i) {
        const float xv = xs[ty + 16 * i][kk];
        for (int j = 0; j < kTn; ++j) acc[i][j] = __fmaf_rn(xv, wv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  for (int i = 0; i < kTm; ++i) {
    const int64_t gr = row0 + ty + 16 * i;
    if (gr >= m) continue;
    for (int j = 0; j < kTn; ++j) {
      const int64_t gc = col0 + tx + 16 * j;
      if (gc < n) y[gr * n + gc] = acc[i][j];
    }
  }
}

}  // namespace

cudaError_t LaunchGemm(const float* x, int64_t m, int64_t k, const float* panels, int64_t n,
                       float* y, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + kBn - 1) / kBn),
                  static_cast<unsigned>((m + kBm - 1) / kBm));
  if (k == 0) return cudaMemsetAsync(y, 0, static_cast<size_t>(m * n) * sizeof(float), stream);
  GemmKernel<<<grid, 256, 0, stream>>>(x, m, k, panels, n, y);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
