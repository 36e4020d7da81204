// IndexerBackend: the seam between the model and the device that runs its indexer — for a
// batch of queries of one Full or Reindex layer, score the visible compressed positions
// (Σ_h relu(q_h·k_t)·w_h, keys from the index-K pages), optionally build or apply the
// candidate pool, and keep the top-k positions.
//
// The contract is the CPU's, bit for bit and position for position: the scores are per
// head one fma chain over the dimension then the head sum in head order (the CPU backend
// computes q·k with the model's matmul backend, whose GEMM has that arithmetic), the
// pool is model::CandidateMask, the selection cpu::TopKAscending. The CUDA backend
// (kernels/cuda_indexer.h) scores straight from the FP4 pages and selects on the device.
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/matmul.h"
#include "engine/spec/chunk_layout.h"

namespace kvc::model {

enum class PoolUse { kNone, kProduce, kApply };

class HeldSelection;

struct IndexerBatch {
  int64_t queries = 0, heads = 0, dim = 0;
  const float* qi = nullptr;   // queries × heads × dim (rotated, FP4-QAT'd)
  const float* w = nullptr;    // queries × heads (head weights, scaled)
  int64_t first_position = 0;  // query r sits at position first_position + r …
  int64_t ratio = 1;           // … and sees its first (first_position + r + 1) / ratio keys
  // The index keys of Full layer `layer`: dequantized (positions × dim) and as stored.
  const float* keys = nullptr;
  int64_t key_rows = 0;  // rows available in `keys`
  std::span<const std::vector<uint8_t>> pages;
  // Per page a number that changes whenever its bytes do, unique across all sequences,
  // and the sequence's identity: a device backend keeps copies of the pages and uploads
  // again only those whose version changed.
  std::span<const uint64_t> page_versions;
  uint64_t sequence = 0;
  const ChunkLayout* layout = nullptr;
  int64_t layer = -1;
  int64_t topk = 0;
  // kProduce: (*pool)[r] becomes query r's candidate mask (blocks of `block` positions,
  // the best `topk_blocks`); kApply: positions outside (*pool)[r] are not selectable.
  PoolUse pool_use = PoolUse::kNone;
  int64_t block = 1, topk_blocks = 0;
  std::vector<std::vector<uint8_t>>* pool = nullptr;
  std::vector<std::vector<int32_t>>* selected = nullptr;  // out: queries entries, ascending
  const MatmulBackend* matmul = nullptr;                  // the CPU backend's q·k
  // The matmul backend when qi or w may be its results still landing
  // (MatmulBackend::GemmGroupLater): a backend reads them where they land, or settles it
  // first.
  const MatmulBackend* landing = nullptr;
  // kApply: the candidate source's selection if still held (HeldSelection), whose pool a
  // backend may read where it was made instead of *pool; one that does not settles it
  // first (which writes *pool). Its queries sit at the same positions with the same ratio.
  HeldSelection* pool_held = nullptr;
};

// A selection left where the backend made it (a device), for an attention backend that
// reads it there (AttentionBackend::ReadsHeld, AttentionBatch::held) instead of the host
// handing it over again. The host's copies — *selected, and *pool when produced — are
// written only by Settle, which waits for this call's work alone: after a later wait that
// covered it (the attention that read it, the next group of products) it costs nothing.
// The batch's `selected` and `pool` must outlive the settling; destruction settles.
class HeldSelection {
 public:
  virtual ~HeldSelection() = default;
  virtual void Settle() = 0;  // idempotent
};

class IndexerBackend {
 public:
  virtual ~IndexerBackend() = default;
  virtual const char* name() const = 0;
  virtual void Select(const IndexerBatch& batch) const = 0;
  // Select, returning without waiting for the result, which stays where it was made.
  // Null, having done nothing, when the backend cannot (the default): call Select then.
  virtual std::unique_ptr<HeldSelection> SelectHeld(const IndexerBatch& batch) const {
    (void)batch;
    return nullptr;
  }
};

std::unique_ptr<IndexerBackend> MakeCpuIndexer();

}  // namespace kvc::model
