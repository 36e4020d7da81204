#include "engine/cpu/softplus.h"
#include "engine/cpu/swiglu.h"
#include "kernels/moe_kernel.cuh"

#include "kernels/gemm_tile.cuh"

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
                               int64_t* counts, int64_t* tiles) {
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
    // The products' tiles: each expert's slots (the shared one's last) cut in runs of at
    // most kBm, so a tile reads one expert's weights.
    int64_t t = 0;
    for (int64_t e = 0; e <= experts; ++e) {
      const int64_t first = e < experts ? start[e] : start[experts];
      const int64_t end = e < experts ? start[e + 1] : start[experts] + rows;
      for (int64_t s = first; s < end; s += gemm_tile::kBm, ++t) {
        tiles[2 * t] = s;
        tiles[2 * t + 1] = end - s < gemm_tile::kBm ? end - s : gemm_tile::kBm;
      }
    }
    counts[2] = t;
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

// Tile t of the slots (tiles[2t], tiles[2t + 1]: first slot, count; t < counts[2]) ×
// columns blockIdx.x: gemm_tile's arithmetic on its expert's panels.
__global__ void SlotGemmKernel(const float* x, const int64_t* slot_row, const int32_t* slot_expert,
                               const float* const* panels, const int64_t* tiles,
                               const int64_t* counts, int64_t k, int64_t n, float* y) {
  __shared__ gemm_tile::Shared sh;
  const int64_t t = blockIdx.y;
  if (t >= counts[2]) return;  // the whole block: fewer tiles than the launch allowed for
  const int64_t first = tiles[2 * t];
  const int rows = static_cast<int>(tiles[2 * t + 1]);
  if (const int r = static_cast<int>(threadIdx.x); r < rows) {
    const int64_t s = first + r;
    sh.x_row[r] = x + (slot_row != nullptr ? slot_row[s] : s) * k;
    sh.y_row[r] = y + s * n;
  }
  __syncthreads();
  gemm_tile::Compute(sh, rows, k, panels[slot_expert[first]], n,
                     static_cast<int64_t>(blockIdx.x) * gemm_tile::kBn);
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

int64_t SlotTilesAtMost(int64_t rows, int64_t k, int64_t experts) {
  // Σ_e ⌈n_e / kBm⌉ ≤ Σ_e (n_e / kBm + 1) over the routed experts (Σ n_e ≤ rows·k), and
  // ⌈rows / kBm⌉ for the shared one.
  return (rows * k) / gemm_tile::kBm + experts + (rows + gemm_tile::kBm - 1) / gemm_tile::kBm;
}

cudaError_t LaunchDispatch(const int32_t* picks, const float* weights, const int32_t* npicks,
                           int64_t rows, int64_t k, int64_t experts, int64_t* slot_row,
                           int32_t* slot_expert, float* slot_weight, int64_t* pick_slot,
                           int64_t* counts, int64_t* tiles, cudaStream_t stream) {
  const size_t shared = static_cast<size_t>(experts + 1) * sizeof(int64_t);
  if (shared > 48 * 1024) return cudaErrorInvalidValue;
  DispatchKernel<<<1, 256, shared, stream>>>(picks, weights, npicks, rows, k, experts, slot_row,
                                             slot_expert, slot_weight, pick_slot, counts, tiles);
  return cudaGetLastError();
}

cudaError_t LaunchSlotGemm(const float* x, const int64_t* slot_row, const int32_t* slot_expert,
                           const float* const* panels, const int64_t* tiles, const int64_t* counts,
                           int64_t max_tiles, int64_t k, int64_t n, float* y, cudaStream_t stream) {
  if (max_tiles * n == 0) return cudaSuccess;
  if (k == 0 || max_tiles > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((n + gemm_tile::kBn - 1) / gemm_tile::kBn),
                  static_cast<unsigned>(max_tiles));
  SlotGemmKernel<<<grid, gemm_tile::kThreads, 0, stream>>>(x, slot_row, slot_expert, panels, tiles,
                                                           counts, k, n, y);
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
