#include "engine/cpu/swiglu.h"
#include "kernels/moe_kernel.cuh"

namespace kvc::cuda {
namespace {

constexpr int kThreads = 128;

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void GatherRowsKernel(const float* x, const int64_t* rows, int64_t n, int64_t width,
                                 float* xs) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * width) return;
  const int64_t m = id / width, c = id % width;
  xs[id] = x[rows[m] * width + c];
}

__global__ void SwiGluKernel(float* g, const float* up, const float* weights, int64_t n,
                             int64_t width, float limit) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * width) return;
  g[id] = cpu::SwiGlu(g[id], up[id], limit, weights[id / width]);
}

__global__ void AddRowsKernel(float* out, int64_t rows, int64_t width, const float* y,
                              const int64_t* start, const int64_t* slot) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * width) return;
  const int64_t r = id / width, c = id % width;
  float acc = out[id];
  for (int64_t e = start[r]; e < start[r + 1]; ++e) acc = __fadd_rn(acc, y[slot[e] * width + c]);
  out[id] = acc;
}

}  // namespace

cudaError_t LaunchGatherRows(const float* x, const int64_t* rows, int64_t n, int64_t width,
                             float* xs, cudaStream_t stream) {
  if (n * width == 0) return cudaSuccess;
  GatherRowsKernel<<<Blocks(n * width), kThreads, 0, stream>>>(x, rows, n, width, xs);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(float* g, const float* up, const float* weights, int64_t n, int64_t width,
                         float limit, cudaStream_t stream) {
  if (n * width == 0) return cudaSuccess;
  SwiGluKernel<<<Blocks(n * width), kThreads, 0, stream>>>(g, up, weights, n, width, limit);
  return cudaGetLastError();
}

cudaError_t LaunchAddRows(float* out, int64_t rows, int64_t width, const float* y,
                          const int64_t* start, const int64_t* slot, cudaStream_t stream) {
  if (rows * width == 0) return cudaSuccess;
  AddRowsKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(out, rows, width, y, start, slot);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
