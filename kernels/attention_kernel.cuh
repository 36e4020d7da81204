// Device launchers of the bandwidth-minded global-KV kernels (C++17 for nvcc):
//  - sparse MQA attention in which each key row is read from memory and dequantized ONCE
//    per block of heads and shared by them through shared memory (the CPU-twin kernel in
//    kv_ops_kernel.cuh reads every row once per head), with an online softmax;
//  - the indexer reading its keys straight from FP4 index pages (Full: every visible
//    position; Reindex: only listed positions, e.g. the candidate pool), still the exact
//    twin of the engine's indexer: per head one fma chain over the dimension in order, then
//    the rectified weighted head sum in head order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/kv_ops_kernel.cuh"

namespace kvc::cuda {

// Same contract as LaunchSparseAttention (window rows for entries >= 0, paged compressed
// rows for entries < 0, sink in the denominator); results within float rounding of it
// (the softmax runs online and the dot products are summed across a warp). dim <= 1024.
cudaError_t LaunchSparseAttentionTiled(const float* q, int64_t queries, int64_t heads, int64_t dim,
                                       const float* window, PagedMainKv paged,
                                       const int32_t* offsets, const int32_t* list,
                                       const float* sink, float scale, float* o,
                                       cudaStream_t stream);

// Where index key j of one Full layer lives in device pages (E2M1 codes, E8M0 per 32).
struct PagedIndexKv {
  const uint8_t* pages = nullptr;
  int64_t page_bytes = 0;
  int64_t per_page = 0;
  int64_t codes_offset = 0;
  int64_t scales_offset = 0;
};

// Full: score[q][t] for t < positions (−inf from visible[q] on), keys from `paged`.
// qi: queries × heads × dim (dim <= 256, heads <= 64), w: queries × heads.
cudaError_t LaunchPagedIndexerScores(const float* qi, const float* w, PagedIndexKv paged,
                                     const int32_t* visible, int64_t queries, int64_t heads,
                                     int64_t dim, int64_t positions, float* score,
                                     cudaStream_t stream);

// Reindex: score[q][i] for the positions list[q·per_query + i] (per_query each; an entry
// −1 pads a shorter list and scores −inf).
cudaError_t LaunchPagedIndexerScoresAt(const float* qi, const float* w, PagedIndexKv paged,
                                       const int32_t* list, int64_t queries, int64_t per_query,
                                       int64_t heads, int64_t dim, float* score,
                                       cudaStream_t stream);

}  // namespace kvc::cuda
