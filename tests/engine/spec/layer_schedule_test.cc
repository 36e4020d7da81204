#include "engine/spec/layer_schedule.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/engine/spec/config_fixtures.h"

namespace kvc {
namespace {

using ::kvc::testing::kMiniConfig;
using ::kvc::testing::kReferenceConfig;
using ::kvc::testing::LoadJson;
using ::kvc::testing::ParseOrDie;
using Json = nlohmann::json;
using M = AttentionMode;

LayerSchedule ScheduleOf(const std::string& path) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(path);
  EXPECT_TRUE(c.ok()) << c.status();
  absl::StatusOr<LayerSchedule> s = BuildLayerSchedule(*c);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : LayerSchedule{};
}

// The modes of layers [begin, end) as a compact string: s=SWA, F=Full, R=Reuse, I=Reindex.
std::string Modes(const LayerSchedule& s, int64_t begin, int64_t end) {
  std::string out;
  for (int64_t i = begin; i < end; ++i) {
    out += "sFIR"[static_cast<int>(s.layers[i].mode)];
  }
  return out;
}

void ExpectRejected(const Json& j, std::initializer_list<std::string> needles) {
  const ModelConfig c = ParseOrDie(j);
  absl::StatusOr<LayerSchedule> s = BuildLayerSchedule(c);
  ASSERT_FALSE(s.ok()) << "accepted";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(s.status().message());
  for (const std::string& n : needles) {
    EXPECT_NE(message.find(n), std::string::npos) << "\"" << n << "\" not in: " << message;
  }
}

TEST(LayerScheduleTest, ReferenceScheduleMatchesTheArchitecture) {
  const LayerSchedule s = ScheduleOf(kReferenceConfig());
  ASSERT_EQ(s.layers.size(), 43u);
  EXPECT_EQ(s.encoder_layers, 20);
  EXPECT_EQ(s.decoder_layers, 20);
  EXPECT_EQ(s.draft_layers, 3);
  // Encoder = SWA×2 + [Full + Reuse×5]×3; decoder = [Full + Reuse×3] + [Reindex + Reuse×3]×4.
  EXPECT_EQ(Modes(s, 0, 20),
            "ss"
            "FRRRRR"
            "FRRRRR"
            "FRRRRR");
  EXPECT_EQ(Modes(s, 20, 40),
            "FRRR"
            "IRRR"
            "IRRR"
            "IRRR"
            "IRRR");
  EXPECT_EQ(Modes(s, 40, 43), "sss");
  for (const LayerPlan& l : s.layers) {
    EXPECT_EQ(l.role, l.index < 20   ? LayerRole::kEncoder
                      : l.index < 40 ? LayerRole::kDecoder
                                     : LayerRole::kDraft)
        << l.index;
  }
  EXPECT_EQ(s.FullLayers(), (std::vector<int64_t>{2, 8, 14, 20}));
}

TEST(LayerScheduleTest, ReferenceSourcesPointAtTheRightLayers) {
  const LayerSchedule s = ScheduleOf(kReferenceConfig());
  // Encoder Reuse layers take KV and top-k from the Full layer that opens their group.
  EXPECT_EQ(s.layers[7].kv_layer, 2);
  EXPECT_EQ(s.layers[7].topk_layer, 2);
  EXPECT_EQ(s.layers[19].kv_layer, 14);
  // Decoder: all global KV is L20's (CED); Reindex layers score L20's index K with their
  // own queries and publish their own top-k, which the next Reuse layers take.
  for (int64_t i = 21; i < 40; ++i) EXPECT_EQ(s.layers[i].kv_layer, 20) << i;
  EXPECT_EQ(s.layers[24].index_k_layer, 20);
  EXPECT_EQ(s.layers[24].topk_layer, 24);
  EXPECT_EQ(s.layers[27].topk_layer, 24);
  EXPECT_EQ(s.layers[23].topk_layer, 20);
  EXPECT_EQ(s.layers[39].topk_layer, 36);
  // Candidate pool: built at L20, restricts the later indexers only.
  EXPECT_TRUE(s.layers[20].is_candidate_source);
  EXPECT_EQ(s.layers[20].candidate_pool_layer, -1);
  EXPECT_EQ(s.layers[28].candidate_pool_layer, 20);
  EXPECT_EQ(s.layers[14].candidate_pool_layer, -1);
  // SWA-only layers use nothing global.
  for (int64_t i : {0, 1, 40, 41, 42}) {
    EXPECT_EQ(s.layers[i].kv_layer, -1);
    EXPECT_EQ(s.layers[i].topk_layer, -1);
  }
  EXPECT_TRUE(s.layers[1].has_engram);
  EXPECT_TRUE(s.layers[14].has_engram);
  EXPECT_FALSE(s.layers[2].has_engram);
  EXPECT_TRUE(s.layers[37].is_dspark_target);
  EXPECT_FALSE(s.layers[36].is_dspark_target);
}

TEST(LayerScheduleTest, MiniConfigHasEveryMechanism) {
  const ModelConfig c = ParseOrDie(LoadJson(kMiniConfig()));
  const LayerSchedule s = ScheduleOf(kMiniConfig());
  int swa = 0, enc_full_then_reuse = 0, dec_full = 0, reindex = 0, engram = 0, draft = 0;
  for (const LayerPlan& l : s.layers) {
    const bool next_reuses = l.index + 1 < static_cast<int64_t>(s.layers.size()) &&
                             s.layers[l.index + 1].mode == M::kReuse &&
                             s.layers[l.index + 1].kv_layer == l.index;
    swa += l.role != LayerRole::kDraft && l.mode == M::kSwaOnly;
    enc_full_then_reuse += l.role == LayerRole::kEncoder && l.mode == M::kFull && next_reuses;
    dec_full += l.role == LayerRole::kDecoder && l.mode == M::kFull;
    reindex += l.role == LayerRole::kDecoder && l.mode == M::kReindex;
    engram += l.has_engram;
    draft += l.role == LayerRole::kDraft;
  }
  EXPECT_GE(swa, 2);
  EXPECT_GE(enc_full_then_reuse, 2);
  EXPECT_GE(dec_full, 1);
  EXPECT_GE(reindex, 2);
  EXPECT_GE(engram, 1);
  EXPECT_GE(draft, 1);
  // The candidate pool is far smaller than a test context of a few hundred tokens.
  EXPECT_LT(c.candidate_topk_blocks * c.candidate_block_size, 64);
}

TEST(LayerScheduleTest, CompressRatiosLengthMustMatchLayers) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["compress_ratios"].erase(42);
  ExpectRejected(j, {"compress_ratios has 42 entries, expected 43", "num_hidden_layers 40",
                     "num_nextn_predict_layers 3"});
}

TEST(LayerScheduleTest, KvSourceWithRatioZeroIsRejected) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["compress_ratios"][2] = 0;
  ExpectRejected(j, {"kv_source_layer_ids contains layer 2", "compress_ratios[2] is 0"});
}

TEST(LayerScheduleTest, ReuseWithoutEarlierFullLayerIsRejected) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["compress_ratios"][1] = 2;  // layer 1 now compresses, but L2 is the first Full
  ExpectRejected(j, {"layer 1 (reuse", "no earlier Full layer"});
}

TEST(LayerScheduleTest, ReindexWithoutEarlierFullLayerIsRejected) {
  Json j = LoadJson(kMiniConfig());
  j["text_config"]["kv_source_layer_ids"] = {6};
  j["text_config"]["index_source_layer_ids"] = {3, 6, 8, 10};
  ExpectRejected(j, {"layer 2 (reuse"});  // L2 now comes first, with no Full before it
  j["text_config"]["compress_ratios"][2] = 0;
  ExpectRejected(j, {"layer 3 (reindex", "no earlier Full layer"});
}

TEST(LayerScheduleTest, SourceWithDifferentRatioIsRejected) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["kv_source_layer_ids"] = {2, 8, 14};  // decoder would reuse encoder KV
  j["text_config"]["index_source_layer_ids"] = {2, 8, 14};
  j["text_config"]["candidate_source_layer_id"] = 14;
  ExpectRejected(
      j, {"layer 20 has compress_ratios[20] = 1", "source layer 14", "compress_ratios[14] = 2"});
}

TEST(LayerScheduleTest, KvSourceMustRunItsIndexer) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["index_source_layer_ids"] = {8, 14, 20, 24, 28, 32, 36};
  ExpectRejected(j, {"kv_source_layer_ids contains layer 2 but index_source_layer_ids does not"});
}

TEST(LayerScheduleTest, CandidateSourceMustBeFull) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["candidate_source_layer_id"] = 24;
  ExpectRejected(j, {"candidate_source_layer_id is 24", "not a Full layer"});
  j["text_config"]["candidate_source_layer_id"] = 41;
  ExpectRejected(j, {"candidate_source_layer_id is 41", "outside [0, 40)"});
}

TEST(LayerScheduleTest, DraftLayersMustBeSwaOnly) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["compress_ratios"][41] = 1;
  ExpectRejected(j, {"compress_ratios[41] is 1", "draft layer"});
}

TEST(LayerScheduleTest, LayerIdListsAreCheckedForRangeAndOrder) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["engram_layer_ids"] = {1, 40};
  ExpectRejected(j, {"engram_layer_ids[1] is 40", "outside [0, 40)"});
  j = LoadJson(kReferenceConfig());
  j["text_config"]["kv_source_layer_ids"] = {8, 2, 14, 20};
  ExpectRejected(j, {"kv_source_layer_ids must be strictly increasing", "2 after 8"});
  j = LoadJson(kReferenceConfig());
  j["text_config"]["num_hidden_layers"] = 39;
  j["text_config"]["compress_ratios"].erase(0);
  ExpectRejected(j, {"num_hidden_layers is 39", "even"});
}

TEST(LayerScheduleTest, ShapesTheFormatsNeedAreChecked) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["head_dim"] = 520;
  ExpectRejected(j, {"head_dim is 520", "multiple of 16"});
  j = LoadJson(kReferenceConfig());
  j["text_config"]["index_head_dim"] = 112;
  ExpectRejected(j, {"index_head_dim is 112", "multiple of 32"});
  j = LoadJson(kReferenceConfig());
  j["text_config"]["candidate_topk_blocks"] = 32;
  j["text_config"]["candidate_block_size"] = 8;
  ExpectRejected(j, {"pool of 249 positions", "fewer than index_topk 512"});
}

}  // namespace
}  // namespace kvc
