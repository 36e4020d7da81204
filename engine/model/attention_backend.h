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
#include "engine/cpu/gemm.h"
#include "engine/model/indexer_backend.h"
#include "engine/model/matmul.h"
#include "engine/spec/chunk_layout.h"

namespace kvc::model {

struct AttentionBatch {
  int64_t queries = 0, heads = 0, dim = 0;
  const float* q = nullptr;       // queries × heads × dim
  std::span<const float> window;  // window rows × dim; entry e >= 0 is row e
  // Optional: the pass's own window rows (fresh_rows × dim) after `window`'s — entry e
  // >= window rows is fresh row e − window rows — so the ring's rows and the new ones
  // need not be copied together on the host.
  const float* fresh = nullptr;
  int64_t fresh_rows = 0;
  // The matmul backend when q or `fresh` may be its results still landing
  // (MatmulBackend::GemmGroupLater): a backend reads them where they land, or settles it
  // first (MatmulBackend::Settle).
  const MatmulBackend* landing = nullptr;
  std::span<const int32_t>
      offsets;  // queries + 1: query i's entries are [offsets[i], offsets[i+1])
  std::span<const int32_t> entries;  // e >= 0: window row e; e < 0: compressed row −e−1
  // Each query's selected compressed rows where the indexer left them (ReadsHeld), to go
  // after its listed entries as −j−1, as the host would have listed them; they are among
  // rows [0, held_rows).
  const HeldSelection* held = nullptr;
  int64_t held_rows = 0;
  // The compressed rows of Full layer `layer`, as the engine holds them (dequantized,
  // rows × dim) and as they are stored (the sequence's pages in `layout`, FP4): the same
  // values. Unused (null / empty / −1) when no entry is negative and none is held.
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

// What follows attention in a layer: each head's output turned back by the inverse RoPE
// at its query's position, then the grouped low-rank output projection — the heads'
// columns cut into wo_a.size() equal groups, group g through wo_a[g], the groups' results
// side by side through wo_b.
struct OutputPath {
  int64_t first_position = 0;  // query r sits at first_position + r
  const std::vector<double>* rope_freqs = nullptr;
  std::span<const cpu::PackedMatrix> wo_a;
  const cpu::PackedMatrix* wo_b = nullptr;
  const MatmulBackend* matmul = nullptr;  // the model's, which holds wo_a and wo_b
};

// Compressed entries [first, first + count) of Full layer `layer`, made where the
// compressor's products are (EmitEntry's steps): entry j sits at position j·ratio; its
// index key (keys row) RMS-normalized by key_norm and turned at that position, its latent
// (latents row, pooled and normalized already) turned too; both quantized into the
// sequence's pages (FP4 main and index, the page of position j·ratio, whose host copy and
// version the model has claimed with SequenceState::WritePage) and, rounded back,
// written to main_out and index_out (count × dim, count × index_dim). The latents and keys
// may be the matmul backend's results still landing (`landing`). `claimed_from`: the
// versions the pages the entries go into had before the model claimed them (0 for a page
// new with them), one per page from the first entry's: a device copy current under those
// is current but for the entries (its host bytes may still be landing).
struct EntryBatch {
  int64_t first = 0, count = 0, ratio = 1;
  int64_t dim = 0, index_dim = 0;
  const float* latents = nullptr;
  const float* keys = nullptr;
  std::span<const float> key_norm;
  double eps = 0.0;
  const std::vector<double>* rope_freqs = nullptr;
  std::span<std::vector<uint8_t>> pages;  // the sequence's, host
  std::span<const uint64_t> page_versions;
  std::span<const uint64_t> claimed_from;
  uint64_t sequence = 0;
  const ChunkLayout* layout = nullptr;
  int64_t layer = -1;
  float* main_out = nullptr;
  float* index_out = nullptr;
  const MatmulBackend* landing = nullptr;
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
  // Whether the backend can take `selection` as AttentionBatch::held (the default: no; the
  // model then settles it and lists the rows itself).
  virtual bool ReadsHeld(const HeldSelection& selection) const {
    (void)selection;
    return false;
  }
  virtual void Attend(const AttentionBatch& batch) const = 0;
  // Attend, then `path`, into out (queries × path.wo_b->out_features()), for a device that
  // keeps the attention output where it is instead of handing it back between the steps.
  // The bits are those of Attend followed by the path on the CPU (cpu::ApplyRope, the
  // matmul backend's products). Returns false, touching nothing, when the backend cannot
  // (the default, or a matmul backend it cannot work with): the model then runs the steps.
  virtual bool AttendAndProject(const AttentionBatch& batch, const OutputPath& path,
                                float* out) const {
    (void)batch;
    (void)path;
    (void)out;
    return false;
  }
  // AttendAndProject, then `then` on its output where that output is (a device backend
  // running the sublayer through the matmul backend's resident weights): the bits of
  // AttendAndProject followed by the sublayer's steps on the host and MatmulBackend::
  // RoutedMoe, with one wait. Returns false, touching nothing, when the backend cannot (the
  // default; a batch or weights the matmul backend does not route): the model then runs
  // AttendAndProject and the sublayer itself.
  virtual bool AttendThenMoe(const AttentionBatch& batch, const OutputPath& path,
                             const MoeSublayer& then) const {
    (void)batch;
    (void)path;
    (void)then;
    return false;
  }
  // The entries written on the device: the pages there first (this backend's and the
  // indexer's reads see them), the host's page bytes, main_out and index_out landing with
  // the matmul backend's next wait — the bits of EmitEntry. Returns false, touching
  // nothing, when the backend cannot (the default): the model writes them on the host.
  virtual bool WriteEntries(const EntryBatch& batch) const {
    (void)batch;
    return false;
  }
};

// model::AttendHead on the CPU thread pool.
std::unique_ptr<AttentionBackend> MakeCpuAttention();

}  // namespace kvc::model
