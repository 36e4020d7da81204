// AttentionBackend: the seam between the model and the device that runs its sparse MQA —
// for a batch of queries of one layer, each query attends its listed rows (window KV rows
// and compressed global-KV rows, in the listed order) with the sink in the denominator.
// The model prepares the lists, the window rows and the rotated queries; the inverse RoPE
// and the output projection come after.
//
// The contract is model::AttendHead's arithmetic per (query, head), bit for bit: the CPU
// backend runs it; the CUDA backend (kernels/cuda_attention.h) runs its exact twin reading
// the compressed rows straight from the FP4 pages. So the engine's results, and exact
// resume, do not depend on where attention runs. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/spec/chunk_layout.h"

namespace kvc::model {

struct AttentionBatch {
  int64_t queries = 0, heads = 0, dim = 0;
  const float* q = nullptr;       // queries × heads × dim
  std::span<const float> window;  // window rows × dim; entry e >= 0 is row e
  std::span<const int32_t>
      offsets;  // queries + 1: query i's entries are [offsets[i], offsets[i+1])
  std::span<const int32_t> entries;  // e >= 0: window row e; e < 0: compressed row −e−1
  // The compressed rows of Full layer `layer`, as the engine holds them (dequantized,
  // rows × dim) and as they are stored (the sequence's pages in `layout`, FP4): the same
  // values. Unused (null / empty / −1) when no entry is negative.
  const float* compressed = nullptr;
  std::span<const std::vector<uint8_t>> pages;
  // Per page a number that changes whenever its bytes do, unique across all sequences,
  // and the sequence's identity: a device backend keeps copies of the pages and uploads
  // again only those whose version changed.
  std::span<const uint64_t> page_versions;
  uint64_t sequence = 0;
  const ChunkLayout* layout = nullptr;
  int64_t layer = -1;
  const float* sink = nullptr;  // heads
  float scale = 0.0f;
  float* out = nullptr;  // queries × heads × dim
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual const char* name() const = 0;
  // Whether the backend can attend with `heads` query heads of `dim` each; Model::Load
  // asks before anything runs, so a config the device cannot serve is refused there
  // (InvalidArgument naming the value) instead of failing at the first call.
  virtual absl::Status CheckShape(int64_t heads, int64_t dim) const {
    (void)heads;
    (void)dim;
    return absl::OkStatus();
  }
  virtual void Attend(const AttentionBatch& batch) const = 0;
};

// model::AttendHead on the CPU thread pool.
std::unique_ptr<AttentionBackend> MakeCpuAttention();

}  // namespace kvc::model
