// Host wrappers of the global-KV kernels (kv_ops_kernel.cuh) for tests, benchmarks and
// the engine's CUDA backend: copy in, launch on device 0, copy out. FailedPrecondition
// without a GPU; InvalidArgument for sizes that do not fit together.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/spec/chunk_layout.h"
#include "engine/spec/kv_codec.h"
#include "kernels/attention_kernel.cuh"
#include "kernels/device_pages.h"
#include "kernels/kv_ops_kernel.cuh"

namespace kvc::cuda {

// The CPU codec's Quantize for the stored formats (main, index), on the device.
[[nodiscard]] absl::Status QuantizeOnDevice(KvFormat format, std::span<const float> x,
                                            std::span<uint8_t> codes, std::span<uint8_t> scales);

// The same queued on `stream` over device memory (n values, whole blocks of the format),
// and its inverse (the CPU codec's Dequantize): what the engine's device entries use.
void QueueQuantize(KvFormat format, const float* d_x, int64_t n, uint8_t* d_codes,
                   uint8_t* d_scales, cudaStream_t stream);
void QueueDequantize(KvFormat format, const uint8_t* d_codes, const uint8_t* d_scales, int64_t n,
                     float* d_out, cudaStream_t stream);

// The CPU codec's FakeQuantize (every format: main and index FP4, the window's FP8), on
// the device: x rounded to the format and back.
[[nodiscard]] absl::StatusOr<std::vector<float>> FakeQuantizeOnDevice(KvFormat format,
                                                                      std::span<const float> x);
// The device's name of a format, and the scale cap its kernels take.
RoundedFormat RoundedFormatOf(KvFormat format);
int MaxScaleCode(KvFormat format);

// Indexer scores of `queries` queries (heads × dim each, with head weights) against
// `positions` keys; query q sees keys t < visible[q]. Returns queries × positions.
[[nodiscard]] absl::StatusOr<std::vector<float>> IndexerScoresOnDevice(
    std::span<const float> qi, std::span<const float> w, std::span<const float> keys,
    std::span<const int32_t> visible, int64_t heads, int64_t dim);

// Device views of Full layer `layer`'s main KV and index key sections in consecutive pages
// of `layout` at `device_pages` (what the launchers take).
PagedMainKv MainSections(const uint8_t* device_pages, const ChunkLayout& layout, int64_t layer);
PagedIndexKv IndexSections(const uint8_t* device_pages, const ChunkLayout& layout, int64_t layer);

// Which attention kernel: the one-thread-per-head twin of the CPU op, or the tiled kernel
// that dequantizes each key row once per block of heads (attention_kernel.cuh).
enum class AttentionKernel { kTwin, kTiled };

// Sparse attention of `queries` × heads query heads (dim each) over, per query, the
// entries list[offsets[q] .. offsets[q+1]): e >= 0 a row of `window`, e < 0 compressed
// row −e−1 of Full layer `layer`, read from `pages` (whole chunks in `layout`).
[[nodiscard]] absl::StatusOr<std::vector<float>> SparseAttentionOnDevice(
    std::span<const float> q, int64_t heads, int64_t dim, std::span<const float> window,
    std::span<const uint8_t> pages, const ChunkLayout& layout, int64_t layer,
    std::span<const int32_t> offsets, std::span<const int32_t> list, std::span<const float> sink,
    float scale, AttentionKernel kernel = AttentionKernel::kTwin);
// The same reading compressed rows straight from pages already in device memory.
[[nodiscard]] absl::StatusOr<std::vector<float>> SparseAttentionOnDevice(
    std::span<const float> q, int64_t heads, int64_t dim, std::span<const float> window,
    const DevicePages& pages, int64_t page_count, int64_t layer, std::span<const int32_t> offsets,
    std::span<const int32_t> list, std::span<const float> sink, float scale,
    AttentionKernel kernel = AttentionKernel::kTwin);

// Indexer scores with the keys read from the FP4 index sections of Full layer `layer` in
// `pages` (whole chunks): every one of `positions` keys (Full; −inf from visible[q] on),
// or only list[q·per_query …] (Reindex over a candidate pool). Bit for bit the engine's.
[[nodiscard]] absl::StatusOr<std::vector<float>> PagedIndexerScoresOnDevice(
    std::span<const float> qi, std::span<const float> w, std::span<const uint8_t> pages,
    const ChunkLayout& layout, int64_t layer, std::span<const int32_t> visible, int64_t heads,
    int64_t dim, int64_t positions);
[[nodiscard]] absl::StatusOr<std::vector<float>> PagedIndexerScoresAtOnDevice(
    std::span<const float> qi, std::span<const float> w, std::span<const uint8_t> pages,
    const ChunkLayout& layout, int64_t layer, std::span<const int32_t> list, int64_t heads,
    int64_t dim);

// The engine's selections on the device, for `queries` rows of `ld` scores each, row q
// holding counts[q] visible scores: the top-k positions (cpu::TopKAscending of each row's
// visible scores), and the candidate pool's positions (those model::CandidateMask sets).
[[nodiscard]] absl::StatusOr<std::vector<std::vector<int32_t>>> TopKOnDevice(
    std::span<const float> scores, int64_t ld, std::span<const int32_t> counts, int64_t k);
[[nodiscard]] absl::StatusOr<std::vector<std::vector<int32_t>>> CandidatePoolOnDevice(
    std::span<const float> scores, int64_t ld, std::span<const int32_t> counts, int64_t block,
    int64_t topk_blocks);

// Attention's entry lists with each query's selection appended, built on the device as the
// CUDA attention builds them from a selection the indexer holds there: query q's own
// entries ([offsets[q], offsets[q + 1]) of `entries`), then −j−1 for each selected j.
// picked[q] (at most k each) are positions, or with `lists` indices into lists[q] (a
// selection made over a candidate pool's positions). Returns the new offsets and entries.
struct EntryLists {
  std::vector<int32_t> offsets, entries;
};
[[nodiscard]] absl::StatusOr<EntryLists> AppendSelectionOnDevice(
    std::span<const int32_t> offsets, std::span<const int32_t> entries,
    const std::vector<std::vector<int32_t>>& picked, int64_t k,
    const std::vector<std::vector<int32_t>>* lists = nullptr);

}  // namespace kvc::cuda
