#include <cmath>

#include "kernels/attention_kernel.cuh"
#include "kernels/fp_codes.cuh"
#include "kernels/query_slices.cuh"

namespace kvc::cuda {
namespace {

constexpr int kWarps = 8;                           // heads per attention block, one warp each
constexpr int kMaxPerLane = kMaxAttentionDim / 32;  // a lane's elements of a head
constexpr int kStageFloats = 48 * 256;              // 48 KiB of staged key rows per block

// Stages rows [k0, k0 + n) of a query's key list as floats in `rows` (n × dim).
__device__ void StageRows(const float* window, const PagedMainKv& p, const int32_t* list,
                          int32_t k0, int n, int64_t dim, float* rows) {
  const int64_t pairs = static_cast<int64_t>(n) * dim / 2;
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int r = static_cast<int>(i / (dim / 2));
    const int64_t e = (i % (dim / 2)) * 2;
    const int32_t entry = list[k0 + r];
    float v0, v1;
    if (entry >= 0) {
      const float* w = window + static_cast<int64_t>(entry) * dim + e;
      v0 = w[0];
      v1 = w[1];
    } else {
      const int64_t j = -static_cast<int64_t>(entry) - 1;
      const uint8_t* page = p.pages + (j / p.per_page) * p.page_bytes;
      const int64_t local = j % p.per_page;
      const uint32_t byte = page[p.main_codes_offset + local * (dim / 2) + e / 2];
      const float s = E4M3Value(page[p.main_scales_offset + local * (dim / 16) + e / 16]);
      v0 = E2M1Value(byte & 0xFu) * s;
      v1 = E2M1Value(byte >> 4) * s;
    }
    rows[r * dim + e] = v0;
    rows[r * dim + e + 1] = v1;
  }
}

// Block (query, group of kWarps heads); warp w owns head group·kWarps + w and keeps its q
// and output slices in registers (lane l holds elements l, l + 32, …).
__global__ void SparseAttentionTiledKernel(const float* q, int64_t heads, int64_t dim,
                                           const float* window, PagedMainKv paged,
                                           const int32_t* offsets, const int32_t* list,
                                           const float* sink, float scale, float* o) {
  extern __shared__ float rows[];
  const int64_t qn = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  const bool active = h < heads;
  const int per_lane = static_cast<int>(dim / 32);
  const int tile = static_cast<int>(kStageFloats / dim);
  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    qv[i] = (active && i < per_lane) ? q[(qn * heads + h) * dim + i * 32 + lane] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int32_t begin = offsets[qn], end = offsets[qn + 1];
  for (int32_t k0 = begin; k0 < end; k0 += tile) {
    const int n = min(tile, end - k0);
    __syncthreads();  // the previous tile is consumed
    StageRows(window, paged, list, k0, n, dim, rows);
    __syncthreads();
    if (!active) continue;
    for (int r = 0; r < n; ++r) {
      const float* kr = rows + static_cast<int64_t>(r) * dim;
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (i < per_lane) d = fmaf(qv[i], kr[i * 32 + lane], d);
      for (int off = 16; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
      const float s = d * scale;
      const float mn = fmaxf(m, s);
      const float corr = expf(m - mn), p = expf(s - mn);
      l = l * corr + p;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (i < per_lane) acc[i] = fmaf(p, kr[i * 32 + lane], acc[i] * corr);
      m = mn;
    }
  }
  if (!active) return;
  // The sink joins the denominator only; no keys at all gives zeros (as the CPU does).
  const float den = end == begin ? 1.0f : l + expf(sink[h] - m);
  float* oh = o + (qn * heads + h) * dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (i < per_lane) oh[i * 32 + lane] = end == begin ? 0.0f : acc[i] / den;
}

// The indexer score of one (query, key): the query's heads and weights are in shared
// memory (qs: heads × dim, ws: heads), the key is decoded element by element from its
// page; per head one fma chain over the dimension, then Σ_h relu(d_h)·w_h in head order.
__device__ float IndexScore(const float* qs, const float* ws, const PagedIndexKv& p, int64_t t,
                            int heads, int64_t dim) {
  const uint8_t* page = p.pages + (t / p.per_page) * p.page_bytes;
  const int64_t local = t % p.per_page;
  const uint8_t* codes = page + p.codes_offset + local * (dim / 2);
  const uint8_t* scales = page + p.scales_offset + local * (dim / 32);
  float d[64];
#pragma unroll
  for (int hh = 0; hh < 64; ++hh) d[hh] = 0.0f;
  for (int64_t e = 0; e < dim; e += 2) {
    const uint32_t byte = codes[e / 2];
    const float s = E8M0Value(scales[e / 32]);
    const float k0 = E2M1Value(byte & 0xFu) * s, k1 = E2M1Value(byte >> 4) * s;
#pragma unroll
    for (int hh = 0; hh < 64; ++hh) {
      if (hh < heads) {
        d[hh] = fmaf(qs[hh * dim + e], k0, d[hh]);
        d[hh] = fmaf(qs[hh * dim + e + 1], k1, d[hh]);
      }
    }
  }
  float sc = 0.0f;
#pragma unroll
  for (int hh = 0; hh < 64; ++hh)
    if (hh < heads) sc = __fadd_rn(sc, __fmul_rn(fmaxf(d[hh], 0.0f), ws[hh]));
  return sc;
}

__device__ void LoadQuery(const float* qi, const float* w, int64_t qn, int heads, int64_t dim,
                          float* qs, float* ws) {
  for (int64_t i = threadIdx.x; i < heads * dim; i += blockDim.x) qs[i] = qi[qn * heads * dim + i];
  for (int i = threadIdx.x; i < heads; i += blockDim.x) ws[i] = w[qn * heads + i];
  __syncthreads();
}

// Scores of query blockIdx.y at its positions: with a list, entry i is position
// list[qn·per_query + i] (−1 pads a shorter list: −inf); without, entry i is position i,
// visible below visible[qn] (−inf past it).
__global__ void PagedIndexerKernel(const float* qi, const float* w, PagedIndexKv paged,
                                   const int32_t* visible, const int32_t* list, int64_t per_query,
                                   int heads, int64_t dim, float* score) {
  extern __shared__ float qs[];
  float* ws = qs + heads * dim;
  const int64_t qn = blockIdx.y;
  LoadQuery(qi, w, qn, heads, dim, qs, ws);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < per_query;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = list != nullptr ? list[qn * per_query + i] : i;
    const bool scored = list != nullptr ? t >= 0 : t < visible[qn];
    score[qn * per_query + i] = scored ? IndexScore(qs, ws, paged, t, heads, dim) : -INFINITY;
  }
}

size_t IndexerSharedBytes(int64_t heads, int64_t dim) {
  return static_cast<size_t>(heads * dim + heads) * sizeof(float);
}

}  // namespace

cudaError_t LaunchSparseAttentionTiled(const float* q, int64_t queries, int64_t heads, int64_t dim,
                                       const float* window, PagedMainKv paged,
                                       const int32_t* offsets, const int32_t* list,
                                       const float* sink, float scale, float* o,
                                       cudaStream_t stream) {
  if (queries == 0 || heads == 0) return cudaSuccess;
  if (dim % 32 != 0 || dim > kMaxAttentionDim) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(queries),
                  static_cast<unsigned>((heads + kWarps - 1) / kWarps));
  const size_t smem = static_cast<size_t>(kStageFloats / dim * dim) * sizeof(float);
  SparseAttentionTiledKernel<<<grid, kWarps * 32, smem, stream>>>(q, heads, dim, window, paged,
                                                                  offsets, list, sink, scale, o);
  return cudaGetLastError();
}

namespace {

// Both indexer launchers: per_query scores for each of `queries` queries.
cudaError_t LaunchPagedIndexer(const float* qi, const float* w, PagedIndexKv paged,
                               const int32_t* visible, const int32_t* list, int64_t queries,
                               int64_t per_query, int64_t heads, int64_t dim, float* score,
                               cudaStream_t stream) {
  if (queries == 0 || per_query == 0) return cudaSuccess;
  if (heads > 64 || dim % 32 != 0 || IndexerSharedBytes(heads, dim) > 48 * 1024)
    return cudaErrorInvalidValue;
  constexpr int kThreads = 128;
  const int64_t blocks = (per_query + kThreads - 1) / kThreads;
  ForEachQuerySlice(queries, [&](int64_t q0, int64_t n) {
    const dim3 grid(static_cast<unsigned>(blocks < 4096 ? blocks : 4096), static_cast<unsigned>(n));
    PagedIndexerKernel<<<grid, kThreads, IndexerSharedBytes(heads, dim), stream>>>(
        qi + q0 * heads * dim, w + q0 * heads, paged, visible != nullptr ? visible + q0 : nullptr,
        list != nullptr ? list + q0 * per_query : nullptr, per_query, static_cast<int>(heads), dim,
        score + q0 * per_query);
  });
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPagedIndexerScores(const float* qi, const float* w, PagedIndexKv paged,
                                     const int32_t* visible, int64_t queries, int64_t heads,
                                     int64_t dim, int64_t positions, float* score,
                                     cudaStream_t stream) {
  return LaunchPagedIndexer(qi, w, paged, visible, nullptr, queries, positions, heads, dim, score,
                            stream);
}

cudaError_t LaunchPagedIndexerScoresAt(const float* qi, const float* w, PagedIndexKv paged,
                                       const int32_t* list, int64_t queries, int64_t per_query,
                                       int64_t heads, int64_t dim, float* score,
                                       cudaStream_t stream) {
  return LaunchPagedIndexer(qi, w, paged, nullptr, list, queries, per_query, heads, dim, score,
                            stream);
}

}  // namespace kvc::cuda
