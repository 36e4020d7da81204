#include <cfloat>
#include <cmath>

#include "engine/cpu/exp.h"
#include "kernels/fp_codes.cuh"
#include "kernels/kv_ops_kernel.cuh"
#include "kernels/query_slices.cuh"
#include "kernels/row_math.cuh"

namespace kvc::cuda {
namespace {

using fp::EncodeE2M1;
using fp::EncodeE4M3;

// The E8M0 scale code, capped where the format's largest value times the scale is still a
// finite float (kv_codec.cc's MaxFiniteE8M0Scale).
__device__ __forceinline__ uint32_t E8M0CeilPow2(float y, int max_code) {
  const uint32_t e = fp::E8M0CeilPow2(y);
  return e > static_cast<uint32_t>(max_code) ? static_cast<uint32_t>(max_code) : e;
}

// A block's scale code and value, as kv_codec.cc's BlockScaleCode and ScaleValue: the
// block maximum (NaN ignored, as on the CPU) floored, then E4M3 of amax/6 (main), or the
// E8M0 ceiling power of two of amax/6 (index) or amax/448 (window), capped at max_e8m0.
__device__ __forceinline__ float BlockScale(RoundedFormat format, const float* xb, int block,
                                            int max_e8m0, uint32_t* code) {
  float amax = 0.0f;
  for (int i = 0; i < block; ++i) {
    const float a = fabsf(xb[i]);
    if (a > amax) amax = a;
  }
  if (format == RoundedFormat::kMainFp4) {
    *code = EncodeE4M3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f);
    return E4M3Value(*code);
  }
  *code = format == RoundedFormat::kWindowFp8
              ? E8M0CeilPow2(fmaxf(amax, 1e-4f) / 448.0f, max_e8m0)
              : E8M0CeilPow2(fmaxf(amax, 6.0f * 0x1p-126f) / 6.0f, max_e8m0);
  return E8M0Value(*code);
}

// One thread per scale block.
__global__ void QuantizeFp4Kernel(Fp4Scale scale, int block, int max_e8m0, const float* x,
                                  int64_t blocks, uint8_t* codes, uint8_t* scales) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const float* xb = x + b * block;
  uint32_t sc;
  const float s =
      BlockScale(scale == Fp4Scale::kE4M3 ? RoundedFormat::kMainFp4 : RoundedFormat::kIndexFp4, xb,
                 block, max_e8m0, &sc);
  scales[b] = static_cast<uint8_t>(sc);
  for (int i = 0; i < block; i += 2) {
    const float v0 = xb[i], v1 = xb[i + 1];
    const uint32_t c0 = isnan(v0) ? 0 : EncodeE2M1(fminf(fmaxf(v0 / s, -6.0f), 6.0f));
    const uint32_t c1 = isnan(v1) ? 0 : EncodeE2M1(fminf(fmaxf(v1 / s, -6.0f), 6.0f));
    codes[(b * block + i) / 2] = static_cast<uint8_t>(c0 | (c1 << 4));
  }
}

// One block of `block` values rounded to its format and back: its scale as the CPU codec's
// BlockScaleCode and ScaleValue, then each value's element code and back, times the scale
// (kv_codec.cc's FakeQuantize).
__device__ __forceinline__ void FakeQuantizeBlock(RoundedFormat format, int block, int max_e8m0,
                                                  float* xb) {
  const bool fp8 = format == RoundedFormat::kWindowFp8;
  uint32_t code;
  const float s = BlockScale(format, xb, block, max_e8m0, &code);
  for (int i = 0; i < block; ++i) {
    const float v = xb[i];
    if (isnan(v)) {
      xb[i] = 0.0f * s;
    } else if (fp8) {
      xb[i] = E4M3Value(EncodeE4M3(fminf(fmaxf(v / s, -448.0f), 448.0f))) * s;
    } else {
      xb[i] = E2M1Value(EncodeE2M1(fminf(fmaxf(v / s, -6.0f), 6.0f))) * s;
    }
  }
}

// One thread per scale block.
__global__ void FakeQuantizeKernel(RoundedFormat format, int block, int max_e8m0, float* x,
                                   int64_t blocks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < blocks) FakeQuantizeBlock(format, block, max_e8m0, x + b * block);
}

// One thread per vector (row r, head h): normalized, its tail turned by row r's turns,
// rounded block by block — the three steps in model::FinishRows' order.
__global__ void FinishRowsKernel(float* y, int64_t rows, int64_t heads, int64_t dim,
                                 const float* norm, double eps, const float* turns, int64_t half,
                                 bool round, RoundedFormat format, int block, int max_e8m0,
                                 float multiplier) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= rows * heads) return;
  float* x = y + v * dim;
  const int64_t r = v / heads;
  if (norm != nullptr) RmsNormRow(x, norm, dim, eps, x);
  if (turns != nullptr) {
    float* t = x + dim - 2 * half;
    for (int64_t i = 0; i < half; ++i)
      TurnPair(t + 2 * i, turns[(r * half + i) * 2], turns[(r * half + i) * 2 + 1]);
  }
  if (round) {
    for (int64_t b = 0; b < dim / block; ++b)
      FakeQuantizeBlock(format, block, max_e8m0, x + b * block);
  }
  if (multiplier != 1.0f) {
    for (int64_t i = 0; i < dim; ++i) x[i] *= multiplier;
  }
}

__global__ void IndexerScoresKernel(const float* qi, const float* w, const float* keys,
                                    const int32_t* visible, int64_t queries, int64_t heads,
                                    int64_t dim, int64_t positions, float* score) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t q = blockIdx.y;
  if (t >= positions || q >= queries) return;
  if (t >= visible[q]) {
    score[q * positions + t] = -INFINITY;
    return;
  }
  const float* kt = keys + t * dim;
  float sc = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = qi + (q * heads + h) * dim;
    float d = 0.0f;
    for (int64_t i = 0; i < dim; ++i) d = fmaf(qh[i], kt[i], d);
    // Explicit rounding steps: no contraction into an FMA the CPU does not do.
    sc = __fadd_rn(sc, __fmul_rn(fmaxf(d, 0.0f), w[q * heads + h]));
  }
  score[q * positions + t] = sc;
}

// Element e of the key of list entry `entry` (window row or paged compressed row).
__device__ __forceinline__ float KeyElement(const float* window, const PagedMainKv& p,
                                            int32_t entry, int64_t dim, int64_t e) {
  if (entry >= 0) return window[static_cast<int64_t>(entry) * dim + e];
  const int64_t j = -static_cast<int64_t>(entry) - 1;
  const uint8_t* page = p.pages + (j / p.per_page) * p.page_bytes;
  const int64_t local = j % p.per_page;
  const uint32_t byte = page[p.main_codes_offset + local * (dim / 2) + e / 2];
  const uint32_t sc = page[p.main_scales_offset + local * (dim / 16) + e / 16];
  return E2M1Value((e % 2) ? (byte >> 4) : (byte & 0xFu)) * E4M3Value(sc);
}

constexpr int kAttnThreads = 256;
constexpr int kAttnPerThread = 4;  // output elements per thread
static_assert(kAttnThreads * kAttnPerThread >= kMaxAttentionDim);
constexpr int kAttnTile = 4096;  // key weights staged per round (16 KiB)

// The largest score of the block's keys, to every thread (max is exact in any order).
__device__ float BlockMax(float m, float* scratch) {
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  float all = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) all = fmaxf(all, scratch[w]);
  __syncthreads();  // scratch is free again
  return all;
}

// One block per (query, head), model::AttendHead's arithmetic exactly, in parallel where
// it is order-free: each key's dot product is one fma chain over e (a thread per key), the
// maximum a reduction; the weights e^{σ−m} a thread per key, staged a tile at a time; the
// denominator one thread's sum in key order; each output element one fma chain over the
// keys in order (a thread per element). Dot products are computed twice (for the maximum,
// then per tile), never stored beyond a tile, so any number of keys fits.
__global__ void SparseAttentionKernel(const float* q, int64_t heads, int64_t dim,
                                      const float* window, PagedMainKv paged,
                                      const int32_t* offsets, const int32_t* list,
                                      const float* sink, float scale, float* o) {
  __shared__ float p[kAttnTile];
  __shared__ float scratch[kAttnThreads / 32];
  __shared__ float den_total;
  const int64_t id = blockIdx.x;  // query · heads + head
  const int64_t qn = id / heads, h = id % heads;
  const float* qh = q + id * dim;
  float* oh = o + id * dim;
  const int32_t begin = offsets[qn], end = offsets[qn + 1];
  if (end == begin) {  // no keys: zeros, as the CPU gives (block-uniform)
    for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) oh[e] = 0.0f;
    return;
  }
  auto score = [&](int32_t k) {
    float d = 0.0f;
    for (int64_t e = 0; e < dim; ++e)
      d = fmaf(qh[e], KeyElement(window, paged, list[k], dim, e), d);
    return __fmul_rn(d, scale);
  };
  float m = -INFINITY;
  for (int32_t k = begin + static_cast<int32_t>(threadIdx.x); k < end; k += blockDim.x)
    m = fmaxf(m, score(k));
  const float mx = BlockMax(m, scratch);
  float acc[kAttnPerThread];
  for (int i = 0; i < kAttnPerThread; ++i) acc[i] = 0.0f;
  float den = 0.0f;  // thread 0's
  for (int32_t t0 = begin; t0 < end; t0 += kAttnTile) {
    const int n = min(kAttnTile, end - t0);
    __syncthreads();  // the previous tile's weights are consumed
    for (int k = threadIdx.x; k < n; k += blockDim.x)
      p[k] = cpu::ExpF(__fsub_rn(score(t0 + k), mx));
    __syncthreads();
    if (threadIdx.x == 0)
      for (int k = 0; k < n; ++k) den = __fadd_rn(den, p[k]);
    for (int i = 0; i < kAttnPerThread; ++i) {
      const int64_t e = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (e >= dim) break;
      for (int k = 0; k < n; ++k)
        acc[i] = fmaf(p[k], KeyElement(window, paged, list[t0 + k], dim, e), acc[i]);
    }
  }
  if (threadIdx.x == 0) den_total = __fadd_rn(den, cpu::ExpF(__fsub_rn(sink[h], mx)));
  __syncthreads();
  for (int i = 0; i < kAttnPerThread; ++i) {
    const int64_t e = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (e < dim) oh[e] = __fdiv_rn(acc[i], den_total);
  }
}

}  // namespace

cudaError_t LaunchQuantizeFp4(Fp4Scale scale, int scale_block, int max_e8m0, const float* x,
                              int64_t n, uint8_t* codes, uint8_t* scales, cudaStream_t stream) {
  const int64_t blocks = n / scale_block;
  if (blocks == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  QuantizeFp4Kernel<<<static_cast<unsigned>((blocks + kThreads - 1) / kThreads), kThreads, 0,
                      stream>>>(scale, scale_block, max_e8m0, x, blocks, codes, scales);
  return cudaGetLastError();
}

cudaError_t LaunchFakeQuantize(RoundedFormat format, int scale_block, int max_e8m0, float* x,
                               int64_t n, cudaStream_t stream) {
  const int64_t blocks = n / scale_block;
  if (blocks == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  FakeQuantizeKernel<<<static_cast<unsigned>((blocks + kThreads - 1) / kThreads), kThreads, 0,
                       stream>>>(format, scale_block, max_e8m0, x, blocks);
  return cudaGetLastError();
}

cudaError_t LaunchFinishRows(float* y, int64_t rows, int64_t heads, int64_t dim, const float* norm,
                             double eps, const float* turns, int64_t half, bool round,
                             RoundedFormat format, int scale_block, int max_e8m0, float multiplier,
                             cudaStream_t stream) {
  if (half < 0 || 2 * half > dim || (round && (scale_block <= 0 || dim % scale_block != 0)))
    return cudaErrorInvalidValue;
  if (rows * heads == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  FinishRowsKernel<<<static_cast<unsigned>((rows * heads + kThreads - 1) / kThreads), kThreads, 0,
                     stream>>>(y, rows, heads, dim, norm, eps, turns, half, round, format,
                               scale_block, max_e8m0, multiplier);
  return cudaGetLastError();
}

cudaError_t LaunchIndexerScores(const float* qi, const float* w, const float* keys,
                                const int32_t* visible, int64_t queries, int64_t heads, int64_t dim,
                                int64_t positions, float* score, cudaStream_t stream) {
  if (queries == 0 || positions == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  ForEachQuerySlice(queries, [&](int64_t q0, int64_t n) {
    const dim3 grid(static_cast<unsigned>((positions + kThreads - 1) / kThreads),
                    static_cast<unsigned>(n));
    IndexerScoresKernel<<<grid, kThreads, 0, stream>>>(qi + q0 * heads * dim, w + q0 * heads, keys,
                                                       visible + q0, n, heads, dim, positions,
                                                       score + q0 * positions);
  });
  return cudaGetLastError();
}

cudaError_t LaunchSparseAttention(const float* q, int64_t queries, int64_t heads, int64_t dim,
                                  const float* window, PagedMainKv paged, const int32_t* offsets,
                                  const int32_t* list, const float* sink, float scale, float* o,
                                  cudaStream_t stream) {
  const int64_t n = queries * heads;
  if (n == 0) return cudaSuccess;
  if (dim > kMaxAttentionDim || n > 0x7FFFFFFF) return cudaErrorInvalidValue;
  SparseAttentionKernel<<<static_cast<unsigned>(n), kAttnThreads, 0, stream>>>(
      q, heads, dim, window, paged, offsets, list, sink, scale, o);
  return cudaGetLastError();
}

}  // namespace kvc::cuda
