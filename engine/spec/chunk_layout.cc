#include "engine/spec/chunk_layout.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/check.h"

namespace kvc {

absl::string_view SectionKindName(SectionKind kind) {
  switch (kind) {
    case SectionKind::kMainCodes:
      return "main_codes";
    case SectionKind::kMainScales:
      return "main_scales";
    case SectionKind::kIndexCodes:
      return "index_codes";
    case SectionKind::kIndexScales:
      return "index_scales";
  }
  return "?";
}

KvEntryBytes EntryBytes(const ModelConfig& config) {
  return {PackedBytes(KvFormat::kMainKv, config.head_dim),
          PackedBytes(KvFormat::kIndexK, config.index_head_dim)};
}

double ChunkLayout::LayerBytesPerToken(int64_t layer) const {
  int64_t bytes = 0;
  for (const ChunkSection& s : sections) {
    if (s.layer == layer) bytes += s.bytes;
  }
  return static_cast<double>(bytes) / static_cast<double>(chunk_tokens);
}

const ChunkSection& ChunkLayout::Section(int64_t layer, SectionKind kind) const {
  for (const ChunkSection& s : sections) {
    if (s.layer == layer && s.kind == kind) return s;
  }
  KVC_CHECK(false) << "layer " << layer << " has no " << SectionKindName(kind) << " section";
  return sections.front();
}

absl::StatusOr<ChunkLayout> BuildChunkLayout(const ModelConfig& config,
                                             const LayerSchedule& schedule, int64_t chunk_tokens) {
  if (chunk_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_tokens must be positive, got ", chunk_tokens));
  }
  ChunkLayout layout;
  layout.chunk_tokens = chunk_tokens;
  layout.entry = EntryBytes(config);
  int64_t offset = 0;
  for (int64_t layer : schedule.FullLayers()) {
    const int64_t ratio = schedule.layers[layer].compress_ratio;
    // Whole compressed positions per chunk, and for the candidate source whole candidate
    // blocks, so a chunk boundary never splits either.
    const int64_t multiple =
        schedule.layers[layer].is_candidate_source ? ratio * config.candidate_block_size : ratio;
    if (chunk_tokens % multiple != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_tokens ", chunk_tokens, " is not a multiple of ", multiple,
                       " (Full layer ", layer, ": compress ratio ", ratio,
                       schedule.layers[layer].is_candidate_source
                           ? absl::StrCat(" × candidate_block_size ", config.candidate_block_size)
                           : std::string(),
                       ")"));
    }
    const int64_t positions = chunk_tokens / ratio;
    const struct {
      SectionKind kind;
      int64_t bytes;
    } parts[] = {
        {SectionKind::kMainCodes, CodesBytes(KvFormat::kMainKv, positions * config.head_dim)},
        {SectionKind::kMainScales, ScalesBytes(KvFormat::kMainKv, positions * config.head_dim)},
        {SectionKind::kIndexCodes,
         CodesBytes(KvFormat::kIndexK, positions * config.index_head_dim)},
        {SectionKind::kIndexScales,
         ScalesBytes(KvFormat::kIndexK, positions * config.index_head_dim)},
    };
    for (const auto& p : parts) {
      layout.sections.push_back({layer, p.kind, positions, offset, p.bytes});
      offset += p.bytes;
    }
  }
  layout.chunk_bytes = offset;
  return layout;
}

}  // namespace kvc
