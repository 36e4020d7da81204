// LayerSchedule: what every layer of a V4.1 Flash model does, derived from its config.
//
// The trunk's first half is the causal encoder, the second half the decoder (CED); the
// `num_nextn_predict_layers` after it are the DSpark draft layers. Each layer with a
// compress ratio > 0 runs CSA2 in one of three modes:
//   Full    (kv_source_layer_ids): computes and stores the compressed main KV and the
//           index K, runs its own indexer;
//   Reindex (index_source_layer_ids minus the Full ones): own indexer queries, scoring the
//           nearest earlier Full layer's index K, stores nothing;
//   Reuse   (every other ratio > 0 layer): reuses the nearest earlier Full layer's KV and
//           the nearest earlier index-producing layer's top-k, stores nothing.
// Layers with ratio 0 keep only their sliding window (SWA only).
//
// BuildLayerSchedule validates every cross-key rule and returns InvalidArgument naming
// the key and the value on the first violation.
#pragma once

#include <cstdint>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "engine/spec/model_config.h"

namespace kvc {

enum class LayerRole { kEncoder, kDecoder, kDraft };
enum class AttentionMode { kSwaOnly, kFull, kReindex, kReuse };

absl::string_view LayerRoleName(LayerRole role);          // "encoder", "decoder", "draft"
absl::string_view AttentionModeName(AttentionMode mode);  // "swa", "full", "reindex", "reuse"

struct LayerPlan {
  int64_t index = 0;
  LayerRole role = LayerRole::kEncoder;
  int64_t compress_ratio = 0;
  AttentionMode mode = AttentionMode::kSwaOnly;
  // Layer whose compressed main KV this layer attends to (itself when Full), -1 if none.
  int64_t kv_layer = -1;
  // Layer whose index K the indexer scores (Full: itself; Reindex: nearest Full), -1 if none.
  int64_t index_k_layer = -1;
  // Layer whose top-k selection this layer uses (itself when Full or Reindex), -1 if none.
  int64_t topk_layer = -1;
  // Whether this layer's indexer builds the candidate pool (block max, newest block kept).
  bool is_candidate_source = false;
  // Layer whose candidate pool restricts this layer's indexer scores, -1 if none.
  int64_t candidate_pool_layer = -1;
  bool has_engram = false;
  // Whether this layer's input feeds the DSpark drafter's main_hidden.
  bool is_dspark_target = false;

  bool stores_global_kv() const { return mode == AttentionMode::kFull; }
  bool runs_indexer() const {
    return mode == AttentionMode::kFull || mode == AttentionMode::kReindex;
  }
};

struct LayerSchedule {
  std::vector<LayerPlan> layers;  // total_layers() entries, in layer order
  int64_t encoder_layers = 0;
  int64_t decoder_layers = 0;
  int64_t draft_layers = 0;

  // Full layers in layer order: the layers whose KV the cache stores.
  std::vector<int64_t> FullLayers() const;
};

[[nodiscard]] absl::StatusOr<LayerSchedule> BuildLayerSchedule(const ModelConfig& config);

}  // namespace kvc
