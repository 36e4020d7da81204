#include "kernels/gemm_kernel.cuh"

#include "kernels/gemm_tile.cuh"

namespace kvc::cuda {
namespace {

using gemm_tile::kBm;
using gemm_tile::kBn;

__global__ void GemmKernel(const float* __restrict__ x, int64_t m, int64_t k,
                           const float* __restrict__ panels, int64_t n, float* __restrict__ y) {
  __shared__ gemm_tile::Shared sh;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBm;
  const int rows = static_cast<int>(m - row0 < kBm ? m - row0 : kBm);
  if (const int r = static_cast<int>(threadIdx.x); r < rows) {
    sh.x_row[r] = x + (row0 + r) * k;
    sh.y_row[r] = y + (row0 + r) * n;
  }
  __syncthreads();
  gemm_tile::Compute(sh, rows, k, panels, n, static_cast<int64_t>(blockIdx.x) * kBn);
}

}  // namespace

cudaError_t LaunchGemm(const float* x, int64_t m, int64_t k, const float* panels, int64_t n,
                       float* y, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + kBn - 1) / kBn),
                  static_cast<unsigned>((m + kBm - 1) / kBm));
  if (k == 0) return cudaMemsetAsync(y, 0, static_cast<size_t>(m * n) * sizeof(float), stream);
  GemmKernel<<<grid, gemm_tile::kThreads, 0, stream>>>(x, m, k, panels, n, y);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
