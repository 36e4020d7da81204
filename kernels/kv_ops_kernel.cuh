// Device launchers for the engine's global-KV ops: FP4 quantization into page sections,
// indexer scoring, and sparse attention whose compressed keys are dequantized from FP4
// pages on the fly. C++17, no abseil (nvcc); kv_ops.cc wraps them. Each kernel is the
// exact twin of its CPU op: the same fused multiply-add chains in the same order per
// output element, so results match bit for bit (tests/kernels/kv_ops_test.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/kv_dequant_kernel.cuh"

namespace kvc::cuda {

// Quantizes n values (n a multiple of scale_block) to E2M1 codes (low nibble = even
// element) and per-block scales: E4M3 of max(amax, 6·2^-9)/6 (scale_block 16) or the
// E8M0 ceiling power of two of max(amax, 6·2^-126)/6 capped at max_e8m0 (scale_block 32).
cudaError_t LaunchQuantizeFp4(Fp4Scale scale, int scale_block, int max_e8m0, const float* x,
                              int64_t n, uint8_t* codes, uint8_t* scales, cudaStream_t stream);

// The CPU codec's FakeQuantize, in place: each block of scale_block values rounded to its
// format and back. kMainFp4 and kIndexFp4 as LaunchQuantizeFp4 (E2M1 elements, E4M3 or
// capped E8M0 scales); kWindowFp8 (the window KV row) E4M3 elements clamped to ±448 under
// the E8M0 ceiling power of two of max(amax, 1e-4)/448 capped at max_e8m0. NaN rounds to 0.
enum class RoundedFormat { kMainFp4, kIndexFp4, kWindowFp8 };
cudaError_t LaunchFakeQuantize(RoundedFormat format, int scale_block, int max_e8m0, float* x,
                               int64_t n, cudaStream_t stream);

// A product's result rows finished in place (model::FinishRows) in one launch, one thread
// per vector: rows × heads vectors of dim, each RMS-normalized by `norm` (if not null;
// LaunchRmsNorm's arithmetic), its last 2·half dims turned by its row's turns (if not null;
// LaunchTurnTails' table and arithmetic), then with `round` rounded to `format` and back
// in blocks of scale_block (LaunchFakeQuantize's), then multiplied by `multiplier` (if not
// 1). cudaErrorInvalidValue for a tail wider than dim or a vector not whole blocks.
cudaError_t LaunchFinishRows(float* y, int64_t rows, int64_t heads, int64_t dim, const float* norm,
                             double eps, const float* turns, int64_t half, bool round,
                             RoundedFormat format, int scale_block, int max_e8m0, float multiplier,
                             cudaStream_t stream);

// score[q][t] = Σ_h relu(Σ_i qi[q][h][i]·keys[t][i]) · w[q][h] for t < visible[q]
// (-inf past it); keys are dequantized rows (dim floats each).
cudaError_t LaunchIndexerScores(const float* qi, const float* w, const float* keys,
                                const int32_t* visible, int64_t queries, int64_t heads, int64_t dim,
                                int64_t positions, float* score, cudaStream_t stream);

// Where compressed row j of one Full layer lives in device pages: page j / per_page, at
// main_codes_offset + (j % per_page)·dim/2 and main_scales_offset + (j % per_page)·dim/16.
struct PagedMainKv {
  const uint8_t* pages = nullptr;  // consecutive pages of page_bytes
  int64_t page_bytes = 0;
  int64_t per_page = 0;  // compressed positions per page
  int64_t main_codes_offset = 0;
  int64_t main_scales_offset = 0;
};

// The largest head dimension the attention kernels take (both keep a query's slice of
// the output in registers).
constexpr int64_t kMaxAttentionDim = 1024;

// Sparse MQA, one block per (query, head), dim <= kMaxAttentionDim: keys of query q are the entries
// list[offsets[q] .. offsets[q+1]); an entry e >= 0 is window row e of `window` (dim
// floats), e < 0 is compressed row −e−1 read from `paged` and dequantized on the fly.
// o = Σ e^{σ−m}·k / (Σ e^{σ−m} + e^{sink_h−m}), σ = scale·q·k.
cudaError_t LaunchSparseAttention(const float* q, int64_t queries, int64_t heads, int64_t dim,
                                  const float* window, PagedMainKv paged, const int32_t* offsets,
                                  const int32_t* list, const float* sink, float scale, float* o,
                                  cudaStream_t stream);

}  // namespace kvc::cuda
