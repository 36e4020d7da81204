// Model: the V4.1 Flash trunk on the CPU — CED prefill, decode, paged global KV, and
// resume from cached pages with bounded or exact replay (docs/model.md).
//
// A Sequence holds one request's state: the per-layer sliding windows (ring buffers of
// FP8-QAT'd KV), the compressors' open groups, and the global KV of the Full layers in
// pages whose bytes are exactly the chunk layout (engine/spec/chunk_layout.h): page c
// holds chunk c (tokens [c·C, (c+1)·C)), so a page is handed to the cache as is and a
// fetched chunk is copied in as is.
//
// Prefill modes:
//   kCed        the encoder (first half) over every token; the decoder's global KV (its
//               first, Full layer's compressor on the encoder output) for every token;
//               the rest of the decoder only over the last `sliding_window` tokens, its
//               windows truncated to that segment.
//   kFullDepth  every layer over every token (the reference CED is measured against).
// Resume(pages of P tokens, whole prompt): imports the pages, replays cached tokens
// through the encoder (never rewriting a global row the pages hold), runs the new tokens,
// then the decoder segment as in kCed. Replay:
//   kBounded    the last `sliding_window` cached tokens (the model's own rule), or the
//               last `bounded_replay_tokens` when that is ≥ 0 (0: no replay; the encoder's
//               windows then start at the first new token), but never fewer than the
//               decoder's segment needs (its window's encoder outputs: window − new tokens)
//               — for measuring what the replay's length buys (kvbench quality);
//   kExact      the encoder's whole dependency window, encoder layers × window tokens,
//               before the first position the decoder reads: the resumed sequence is
//               then bit-identical to a cold kCed prefill of the same prompt. Needs a
//               batch-invariant matmul backend (FailedPrecondition otherwise).
// Thread-compatible: one Sequence per thread; a Model may serve many.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/attention_backend.h"
#include "engine/model/indexer_backend.h"
#include "engine/model/matmul.h"
#include "engine/spec/chunk_layout.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"

namespace kvc::model {

enum class PrefillMode { kCed, kFullDepth };
enum class ReplayMode { kBounded, kExact };

struct ForwardStats {
  int64_t encoder_tokens = 0;     // tokens run through each encoder layer
  int64_t decoder_tokens = 0;     // tokens run through each decoder layer (beyond the compressor)
  int64_t replayed_tokens = 0;    // cached tokens recomputed by a resume
  int64_t compressed_tokens = 0;  // tokens the decoder's global-KV compressor consumed
};

class SequenceState;

// What Rollback needs to undo tokens run after it (speculative verification).
class SequenceCheckpoint {
 public:
  SequenceCheckpoint();
  ~SequenceCheckpoint();
  SequenceCheckpoint(SequenceCheckpoint&&) noexcept = default;

 private:
  friend class Model;
  struct Layer;
  int64_t tokens_ = 0, full_tokens_ = 0;
  std::vector<Layer> layers_;
};

class Sequence {
 public:
  ~Sequence();
  Sequence(Sequence&&) noexcept;
  Sequence& operator=(Sequence&&) noexcept;
  int64_t length() const;  // tokens processed
  const std::vector<uint32_t>& tokens() const;
  int64_t complete_chunks() const;  // pages whose every row is written
  std::span<const uint8_t> page(int64_t chunk) const;
  const ForwardStats& last_stats() const;

 private:
  friend class Model;
  explicit Sequence(std::unique_ptr<SequenceState> s);
  std::unique_ptr<SequenceState> s_;
};

class ModelImpl;

struct ModelOptions {
  int64_t chunk_tokens = kDefaultChunkTokens;
  // Where the matrix products run (null: the CPU). The model owns it; Load registers
  // every weight with it.
  std::unique_ptr<MatmulBackend> matmul;
  // Where the sparse attention runs (null: the CPU). Owned by the model.
  std::unique_ptr<AttentionBackend> attention;
  // Where the indexer scores and selects (null: the CPU). Owned by the model.
  std::unique_ptr<IndexerBackend> indexer;
};

class Model {
 public:
  // Loads `weights_path` (safetensors) for `config`; every tensor is checked against the
  // config (missing, wrong shape, unexpected → InvalidArgument naming it).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const ModelConfig& config,
                                                     const std::string& weights_path,
                                                     int64_t chunk_tokens = kDefaultChunkTokens);
  static absl::StatusOr<std::unique_ptr<Model>> Load(const ModelConfig& config,
                                                     const std::string& weights_path,
                                                     ModelOptions options);
  ~Model();
  const char* matmul_backend() const;
  const char* attention_backend() const;
  const char* indexer_backend() const;

  const ModelConfig& config() const;
  const LayerSchedule& schedule() const;
  const ChunkLayout& layout() const;

  Sequence NewSequence() const;
  // Runs `tokens` on an empty sequence; returns the logits of the last position.
  absl::StatusOr<std::vector<float>> Prefill(Sequence& seq, std::span<const uint32_t> tokens,
                                             PrefillMode mode) const;
  // Appends one token; returns its logits.
  absl::StatusOr<std::vector<float>> Decode(Sequence& seq, uint32_t token) const;
  // Appends several tokens in one pass; the logits of each. Bit-identical to decoding them
  // one by one (every op is batch invariant), which is what makes verification lossless.
  absl::StatusOr<std::vector<std::vector<float>>> Extend(Sequence& seq,
                                                         std::span<const uint32_t> tokens) const;

  // DSpark: proposes dspark_block_size tokens to follow `next` (the token about to be
  // appended), greedily, from the drafter's view of the sequence. Does not change `seq`.
  bool has_drafter() const;
  absl::StatusOr<std::vector<uint32_t>> Draft(Sequence& seq, uint32_t next) const;
  SequenceCheckpoint Checkpoint(const Sequence& seq) const;
  void Rollback(Sequence& seq, const SequenceCheckpoint& checkpoint) const;
  // On an empty sequence: imports `pages` (P / chunk_tokens whole chunks, in order, for
  // the first P tokens of `tokens`) and runs the rest of `tokens` (P < tokens.size()).
  absl::StatusOr<std::vector<float>> Resume(Sequence& seq, std::span<const uint8_t> pages,
                                            int64_t cached_tokens, std::span<const uint32_t> tokens,
                                            ReplayMode replay,
                                            int64_t bounded_replay_tokens = -1) const;
  // The same with the pages still on their way: the layers that read no page (the
  // sliding-window-only layers before the first compressed one) run first, then `pages`
  // is called once and may block until the fetch is done. An error it returns ends the
  // resume with that error (the sequence must then be discarded).
  using PageSource = std::function<absl::StatusOr<std::span<const uint8_t>>()>;
  absl::StatusOr<std::vector<float>> Resume(Sequence& seq, const PageSource& pages,
                                            int64_t cached_tokens, std::span<const uint32_t> tokens,
                                            ReplayMode replay,
                                            int64_t bounded_replay_tokens = -1) const;

 private:
  explicit Model(std::unique_ptr<ModelImpl> impl);
  std::unique_ptr<ModelImpl> impl_;
};

}  // namespace kvc::model
