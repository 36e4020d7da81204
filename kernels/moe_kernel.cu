#include "engine/cpu/softplus.h"
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
                             int64_t width, float limit, const int64_t* count) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * width || (count != nullptr && id / width >= *count)) return;
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

// One thread per row (a block each): cpu::TopKAscending's scan, kept in shared memory.
__global__ void RouteKernel(const float* logits, const float* bias, int64_t experts, int64_t k,
                            bool normalize, float scale, int32_t* picks, float* weights,
                            int32_t* npicks) {
  __shared__ float best_v[kMaxRoutedPerToken + 1];
  __shared__ int32_t best_i[kMaxRoutedPerToken + 1];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * experts;
  int64_t size = 0;
  for (int64_t e = 0; e < experts && k > 0; ++e) {
    const float v = __fadd_rn(cpu::SqrtSoftplus(l[e]), bias[e]);
    if (v == -INFINITY) continue;
    if (size == k && !(v > best_v[size - 1])) continue;
    int64_t at = size;
    while (at > 0 && v > best_v[at - 1]) --at;
    for (int64_t j = size; j > at; --j) {
      best_v[j] = best_v[j - 1];
      best_i[j] = best_i[j - 1];
    }
    best_v[at] = v;
    best_i[at] = static_cast<int32_t>(e);
    if (++size > k) --size;
  }
  for (int64_t a = 1; a < size; ++a) {  // increasing expert order
    const int32_t e = best_i[a];
    int64_t b = a;
    for (; b > 0 && best_i[b - 1] > e; --b) best_i[b] = best_i[b - 1];
    best_i[b] = e;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < size; ++j) sum = __fadd_rn(sum, cpu::SqrtSoftplus(l[best_i[j]]));
  for (int64_t j = 0; j < size; ++j) {
    const float score = cpu::SqrtSoftplus(l[best_i[j]]);
    const float w = normalize ? __fdiv_rn(score, __fadd_rn(sum, 1e-20f)) : score;
    picks[r * k + j] = best_i[j];
    weights[r * k + j] = __fmul_rn(w, scale);
  }
  npicks[r] = static_cast<int32_t>(size);
}

// One block: each thread counts and then fills the slots of its experts; thread 0 sums.
__global__ void DispatchKernel(const int32_t* picks, const float* weights, const int32_t* npicks,
                               int64_t rows, int64_t k, int64_t experts, int64_t* slot_row,
                               int32_t* slot_expert, float* slot_weight, int64_t* pick_slot,
                               int64_t* counts) {
  extern __shared__ int64_t start[];  // experts + 1
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < npicks[r]; ++j) n += picks[r * k + j] == e;
    start[e + 1] = n;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int64_t e = 0; e < experts; ++e) start[e + 1] += start[e];
    counts[0] = start[experts] + rows;
    counts[1] = start[experts];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int64_t s = start[e];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < npicks[r]; ++j) {
        if (picks[r * k + j] != e) continue;
        slot_row[s] = r;
        slot_expert[s] = static_cast<int32_t>(e);
        slot_weight[s] = weights[r * k + j];
        pick_slot[r * k + j] = s++;
      }
    }
  }
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t s = start[experts] + r;
    slot_row[s] = r;
    slot_expert[s] = static_cast<int32_t>(experts);
    slot_weight[s] = 1.0f;
  }
}

constexpr int kPanel = 16;  // engine/cpu/gemm.h PackedMatrix::kPanel

__global__ void SlotGemmKernel(const float* x, const int64_t* slot_row, const int32_t* slot_expert,
                               const float* const* panels, const int64_t* count, int64_t k,
                               int64_t n, float* y) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = id / n, c = id % n;
  if (s >= *count) return;
  const float* xr = x + (slot_row != nullptr ? slot_row[s] : s) * k;
  const float* w = panels[slot_expert[s]] + (c / kPanel) * k * kPanel + c % kPanel;
  float acc = 0.0f;
  for (int64_t kk = 0; kk < k; ++kk) acc = __fmaf_rn(xr[kk], w[kk * kPanel], acc);
  y[s * n + c] = acc;
}

__global__ void SumPicksKernel(const float* y, const int64_t* pick_slot, const int32_t* npicks,
                               const int64_t* counts, int64_t rows, int64_t k, int64_t width,
                               float* out) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * width) return;
  const int64_t r = id / width, c = id % width;
  float acc = 0.0f;
  for (int64_t j = 0; j < npicks[r]; ++j) acc = __fadd_rn(acc, y[pick_slot[r * k + j] * width + c]);
  out[id] = __fadd_rn(acc, y[(counts[1] + r) * width + c]);
}

}  // namespace

cudaError_t LaunchGatherRows(const float* x, const int64_t* rows, int64_t n, int64_t width,
                             float* xs, cudaStream_t stream) {
  if (n * width == 0) return cudaSuccess;
  GatherRowsKernel<<<Blocks(n * width), kThreads, 0, stream>>>(x, rows, n, width, xs);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(float* g, const float* up, const float* weights, int64_t n, int64_t width,
                         float limit, cudaStream_t stream, const int64_t* count) {
  if (n * width == 0) return cudaSuccess;
  SwiGluKernel<<<Blocks(n * width), kThreads, 0, stream>>>(g, up, weights, n, width, limit, count);
  return cudaGetLastError();
}

cudaError_t LaunchAddRows(float* out, int64_t rows, int64_t width, const float* y,
                          const int64_t* start, const int64_t* slot, cudaStream_t stream) {
  if (rows * width == 0) return cudaSuccess;
  AddRowsKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(out, rows, width, y, start, slot);
  return cudaGetLastError();
}

cudaError_t LaunchRoute(const float* logits, const float* bias, int64_t rows, int64_t experts,
                        int64_t k, bool normalize, float scale, int32_t* picks, float* weights,
                        int32_t* npicks, cudaStream_t stream) {
  if (k < 0 || k > kMaxRoutedPerToken) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  RouteKernel<<<static_cast<unsigned>(rows), 1, 0, stream>>>(logits, bias, experts, k, normalize,
                                                             scale, picks, weights, npicks);
  return cudaGetLastError();
}

cudaError_t LaunchDispatch(const int32_t* picks, const float* weights, const int32_t* npicks,
                           int64_t rows, int64_t k, int64_t experts, int64_t* slot_row,
                           int32_t* slot_expert, float* slot_weight, int64_t* pick_slot,
                           int64_t* counts, cudaStream_t stream) {
  const size_t shared = static_cast<size_t>(experts + 1) * sizeof(int64_t);
  if (shared > 48 * 1024) return cudaErrorInvalidValue;
  DispatchKernel<<<1, 256, shared, stream>>>(picks, weights, npicks, rows, k, experts, slot_row,
                                             slot_expert, slot_weight, pick_slot, counts);
  return cudaGetLastError();
}

cudaError_t LaunchSlotGemm(const float* x, const int64_t* slot_row, const int32_t* slot_expert,
                           const float* const* panels, const int64_t* count, int64_t max_slots,
                           int64_t k, int64_t n, float* y, cudaStream_t stream) {
  if (max_slots * n == 0) return cudaSuccess;
  SlotGemmKernel<<<Blocks(max_slots * n), kThreads, 0, stream>>>(x, slot_row, slot_expert, panels,
                                                                 count, k, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchSumPicks(const float* y, const int64_t* pick_slot, const int32_t* npicks,
                           const int64_t* counts, int64_t rows, int64_t k, int64_t width,
                           float* out, cudaStream_t stream) {
  if (rows * width == 0) return cudaSuccess;
  SumPicksKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(y, pick_slot, npicks, counts, rows,
                                                                k, width, out);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
