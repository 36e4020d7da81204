#include "engine/spec/chunk_layout.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/engine/spec/config_fixtures.h"

namespace kvc {
namespace {

using ::kvc::testing::kMiniConfig;
using ::kvc::testing::kReferenceConfig;
using ::kvc::testing::LoadJson;
using ::kvc::testing::PaperFormula;
using ::kvc::testing::ParseOrDie;
using Json = nlohmann::json;

ChunkLayout LayoutOf(const ModelConfig& c, int64_t chunk_tokens) {
  absl::StatusOr<LayerSchedule> s = BuildLayerSchedule(c);
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<ChunkLayout> l = BuildChunkLayout(c, *s, chunk_tokens);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : ChunkLayout{};
}

TEST(ChunkLayoutTest, ReferenceIs890BytesPerTokenAnd227840PerChunk) {
  const Json j = LoadJson(kReferenceConfig());
  const ChunkLayout l = LayoutOf(ParseOrDie(j), kDefaultChunkTokens);
  EXPECT_EQ(l.entry.main, 288);
  EXPECT_EQ(l.entry.index, 68);
  EXPECT_DOUBLE_EQ(l.bytes_per_token(), PaperFormula(j["text_config"]));
  // The figure the technical report publishes, and the chunk size DESIGN.md states.
  EXPECT_DOUBLE_EQ(l.bytes_per_token(), 890.0);
  EXPECT_EQ(l.chunk_bytes, 227840);
  EXPECT_EQ(l.chunk_tokens, 256);
}

TEST(ChunkLayoutTest, ReindexLayersStoreNothingSo1162IsImpossible) {
  const Json j = LoadJson(kReferenceConfig());
  const ModelConfig c = ParseOrDie(j);
  const LayerSchedule s = *BuildLayerSchedule(c);
  const ChunkLayout l = LayoutOf(c, kDefaultChunkTokens);
  double reindex_index_k = 0;
  for (const LayerPlan& p : s.layers) {
    if (p.mode != AttentionMode::kFull) {
      EXPECT_EQ(l.LayerBytesPerToken(p.index), 0.0) << p.index;
    }
    if (p.mode == AttentionMode::kReindex) {
      reindex_index_k += static_cast<double>(l.entry.index) / p.compress_ratio;
    }
  }
  // The known mistake counts an index K for every Reindex layer as well.
  EXPECT_GT(reindex_index_k, 0);
  EXPECT_NE(l.bytes_per_token(), l.bytes_per_token() + reindex_index_k);
  EXPECT_DOUBLE_EQ(l.bytes_per_token() + reindex_index_k, 1162.0);
}

TEST(ChunkLayoutTest, SectionsAreContiguousInLayerOrder) {
  for (const std::string& path : {kReferenceConfig(), kMiniConfig()}) {
    const ModelConfig c = ParseOrDie(LoadJson(path));
    const ChunkLayout l = LayoutOf(c, kDefaultChunkTokens);
    const std::vector<int64_t> full = BuildLayerSchedule(c)->FullLayers();
    ASSERT_EQ(l.sections.size(), 4 * full.size()) << path;
    int64_t offset = 0;
    for (size_t i = 0; i < l.sections.size(); ++i) {
      const ChunkSection& s = l.sections[i];
      EXPECT_EQ(s.layer, full[i / 4]);
      EXPECT_EQ(static_cast<int>(s.kind), static_cast<int>(i % 4));
      EXPECT_EQ(s.offset, offset);
      EXPECT_EQ(s.positions, kDefaultChunkTokens / c.compress_ratios[s.layer]);
      offset += s.bytes;
    }
    EXPECT_EQ(offset, l.chunk_bytes);
    const ChunkSection& main_scales = l.Section(full.back(), SectionKind::kMainScales);
    EXPECT_EQ(main_scales.bytes, main_scales.positions * c.head_dim / 16);
  }
}

TEST(ChunkLayoutTest, NumbersFollowTheConfigNotConstants) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["head_dim"] = 256;
  j["text_config"]["index_head_dim"] = 64;
  j["text_config"]["kv_source_layer_ids"] = {2, 20};
  j["text_config"]["index_source_layer_ids"] = {2, 20, 24};
  const ChunkLayout l = LayoutOf(ParseOrDie(j), 512);
  EXPECT_DOUBLE_EQ(l.bytes_per_token(), PaperFormula(j["text_config"]));
  EXPECT_EQ(l.chunk_bytes, static_cast<int64_t>(PaperFormula(j["text_config"]) * 512));
  EXPECT_NE(l.bytes_per_token(), 890.0);

  const Json mini = LoadJson(kMiniConfig());
  EXPECT_DOUBLE_EQ(LayoutOf(ParseOrDie(mini), 64).bytes_per_token(),
                   PaperFormula(mini["text_config"]));
}

TEST(ChunkLayoutTest, ChunkTokensMustAlignWithRatiosAndCandidateBlocks) {
  const ModelConfig c = ParseOrDie(LoadJson(kReferenceConfig()));
  const LayerSchedule s = *BuildLayerSchedule(c);
  for (int64_t bad : {0, -256}) {
    absl::StatusOr<ChunkLayout> l = BuildChunkLayout(c, s, bad);
    ASSERT_FALSE(l.ok());
    EXPECT_NE(
        l.status().message().find("chunk_tokens must be positive, got " + std::to_string(bad)),
        std::string::npos)
        << l.status();
  }
  absl::StatusOr<ChunkLayout> odd = BuildChunkLayout(c, s, 255);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("chunk_tokens 255 is not a multiple of 2 (Full layer 2"),
            std::string::npos)
      << odd.status();
  absl::StatusOr<ChunkLayout> split_block = BuildChunkLayout(c, s, 260);
  ASSERT_FALSE(split_block.ok());
  EXPECT_NE(split_block.status().message().find("not a multiple of 8 (Full layer 20"),
            std::string::npos)
      << split_block.status();
  EXPECT_TRUE(BuildChunkLayout(c, s, 8).ok());
}

}  // namespace
}  // namespace kvc
