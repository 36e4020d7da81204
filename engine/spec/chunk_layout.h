// ChunkLayout: the byte layout of one cached chunk (C tokens of global KV), computed
// from the layer schedule. It is identical to the engine's paged-cache page, so a
// fetched chunk is copied to the device without repacking.
//
// For each Full layer, in layer order, four contiguous sections of P = C / ratio
// compressed positions each:
//   main codes  (P × head_dim / 2)      main scales  (P × head_dim / 16, E4M3)
//   index codes (P × index_head_dim / 2) index scales (P × index_head_dim / 32, E8M0)
// Reference config, C = 256: 227,840 bytes = 890 B/token × 256.
#pragma once

#include <cstdint>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "engine/spec/kv_codec.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"

namespace kvc {

// Version of the chunk byte layout and codecs; part of every namespace's identity.
inline constexpr uint32_t kKvLayoutVersion = 1;
// Tokens per chunk unless a namespace picks another size.
inline constexpr int64_t kDefaultChunkTokens = 256;

enum class SectionKind { kMainCodes, kMainScales, kIndexCodes, kIndexScales };
absl::string_view SectionKindName(SectionKind kind);  // "main_codes", ...

struct ChunkSection {
  int64_t layer = 0;
  SectionKind kind = SectionKind::kMainCodes;
  int64_t positions = 0;  // compressed positions of this layer in one chunk
  int64_t offset = 0;     // bytes from the start of the chunk
  int64_t bytes = 0;
};

// Bytes one compressed position of a Full layer stores: main KV and index K entries.
struct KvEntryBytes {
  int64_t main = 0;   // head_dim / 2 + head_dim / 16 (288 for the reference)
  int64_t index = 0;  // index_head_dim / 2 + index_head_dim / 32 (68 for the reference)
  int64_t total() const { return main + index; }
};
KvEntryBytes EntryBytes(const ModelConfig& config);

struct ChunkLayout {
  int64_t chunk_tokens = 0;
  int64_t chunk_bytes = 0;
  KvEntryBytes entry;
  std::vector<ChunkSection> sections;  // in byte order, contiguous

  // Global KV bytes per token. Exact: chunk_tokens is a multiple of every ratio.
  double bytes_per_token() const {
    return static_cast<double>(chunk_bytes) / static_cast<double>(chunk_tokens);
  }
  // Bytes per token that Full layer `layer` stores (0 for any other layer).
  double LayerBytesPerToken(int64_t layer) const;
  // The section of `layer` of the given kind; KVC_CHECK-fails if the layer is not Full.
  const ChunkSection& Section(int64_t layer, SectionKind kind) const;
};

// chunk_tokens must be positive, a multiple of every Full layer's compress ratio, and for
// the candidate source a multiple of ratio × candidate_block_size (so neither a compressed
// position nor a candidate block straddles two chunks); otherwise InvalidArgument naming
// the value.
[[nodiscard]] absl::StatusOr<ChunkLayout> BuildChunkLayout(const ModelConfig& config,
                                                           const LayerSchedule& schedule,
                                                           int64_t chunk_tokens);

}  // namespace kvc
