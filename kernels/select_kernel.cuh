// Device launchers of the indexer's selections (C++17 for nvcc), twins of the engine's:
//  - top-k: per query, the k highest scores among its first counts[q] (−inf never taken),
//    ties to the lower position, written as positions in increasing order — exactly
//    cpu::TopKAscending's set and order (scores are never NaN in the engine);
//  - block maxima for the candidate pool: per block of `block` positions the highest
//    score, the block holding the query's last visible position forced to +inf (it always
//    enters the pool) — model::CandidateMask's ranking.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda {

// scores: queries × ld; out: queries × k positions (−1 past out_count[q]).
cudaError_t LaunchTopK(const float* scores, int64_t ld, const int32_t* counts, int64_t queries,
                       int64_t k, int32_t* out, int32_t* out_count, cudaStream_t stream);

// best: queries × ceil(ld / block); blocks past a query's last visible one are −inf.
cudaError_t LaunchBlockMaxima(const float* scores, int64_t ld, const int32_t* counts,
                              int64_t queries, int64_t block, float* best, cudaStream_t stream);

// The candidate pool as positions: for each query, every visible position of the blocks
// listed in blocks[q·topk_blocks …] (ascending, −1 = none), in increasing order, −1 after
// pool_count[q] (pool: queries × topk_blocks·block).
cudaError_t LaunchPoolPositions(const int32_t* blocks, int64_t topk_blocks, int64_t block,
                                const int32_t* counts, int64_t queries, int32_t* pool,
                                int32_t* pool_count, cudaStream_t stream);

// A selection made over lists of positions (top-k over list indices) turned into the
// positions: sel[q·k + i] = list[q·width + sel[q·k + i]] for i < count[q], in place.
cudaError_t LaunchListPositions(const int32_t* list, int64_t width, const int32_t* count,
                                int64_t queries, int64_t k, int32_t* sel, cudaStream_t stream);

// Attention's entry lists with each query's selection appended: query q's entries are its
// own ([offsets[q], offsets[q+1]) of `entries`) then −j−1 for each of its count[q]
// selected positions j (sel: queries × k) — the lists the host builds, built where the
// selection is. out_offsets: queries + 1; out_entries: room for offsets[queries] + queries·k.
cudaError_t LaunchAppendSelection(const int32_t* offsets, const int32_t* entries, int64_t queries,
                                  const int32_t* sel, const int32_t* count, int64_t k,
                                  int32_t* out_offsets, int32_t* out_entries, cudaStream_t stream);

}  // namespace kvc::cuda
