#include "engine/spec/layer_schedule.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvc {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// A list of layer ids must be strictly increasing and inside [0, limit).
absl::Status CheckLayerIds(const char* key, const std::vector<int64_t>& ids, int64_t limit,
                           const char* limit_meaning) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limit) {
      return Invalid(absl::StrCat(key, "[", i, "] is ", ids[i], ", outside [0, ", limit, ") (",
                                  limit_meaning, ")"));
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      return Invalid(absl::StrCat(key, " must be strictly increasing, but entry ", i, " is ",
                                  ids[i], " after ", ids[i - 1]));
    }
  }
  return absl::OkStatus();
}

bool Contains(const std::vector<int64_t>& ids, int64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Sizes the number formats and the attention math need to divide evenly.
absl::Status CheckShapes(const ModelConfig& c) {
  if (c.head_dim % 16 != 0) {
    return Invalid(absl::StrCat("head_dim is ", c.head_dim,
                                ", must be a multiple of 16 (one E4M3 scale per 16 channels)"));
  }
  if (c.index_head_dim % 32 != 0) {
    return Invalid(absl::StrCat("index_head_dim is ", c.index_head_dim,
                                ", must be a multiple of 32 (one E8M0 scale per 32 channels)"));
  }
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim > c.head_dim ||
      c.qk_rope_head_dim > c.index_head_dim) {
    return Invalid(absl::StrCat("qk_rope_head_dim is ", c.qk_rope_head_dim,
                                ", must be even and at most head_dim (", c.head_dim,
                                ") and index_head_dim (", c.index_head_dim, ")"));
  }
  if ((c.num_attention_heads * c.head_dim) % c.o_groups != 0) {
    return Invalid(
        absl::StrCat("num_attention_heads × head_dim = ", c.num_attention_heads * c.head_dim,
                     " is not divisible by o_groups ", c.o_groups));
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    return Invalid(absl::StrCat("num_experts_per_tok ", c.num_experts_per_tok,
                                " exceeds n_routed_experts ", c.n_routed_experts));
  }
  if (c.dspark_num_experts_per_tok > c.dspark_n_routed_experts) {
    return Invalid(absl::StrCat("dspark_num_experts_per_tok ", c.dspark_num_experts_per_tok,
                                " exceeds dspark_n_routed_experts ", c.dspark_n_routed_experts));
  }
  // The candidate pool must leave at least index_topk real positions, or -inf picks would
  // leak through the top-k (the newest block may be partial, hence the block_size - 1).
  const int64_t pool =
      c.candidate_topk_blocks * c.candidate_block_size - (c.candidate_block_size - 1);
  if (pool < c.index_topk) {
    return Invalid(absl::StrCat("candidate_topk_blocks ", c.candidate_topk_blocks,
                                " × candidate_block_size ", c.candidate_block_size,
                                " leaves a pool of ", pool, " positions, fewer than index_topk ",
                                c.index_topk));
  }
  return absl::OkStatus();
}

// Nearest layer before `layer` (in layer order) that satisfies `pred`, or -1.
template <typename Pred>
int64_t NearestEarlier(const std::vector<LayerPlan>& layers, int64_t layer, Pred pred) {
  for (int64_t j = layer - 1; j >= 0; --j) {
    if (pred(layers[j])) return j;
  }
  return -1;
}

}  // namespace

absl::string_view LayerRoleName(LayerRole role) {
  switch (role) {
    case LayerRole::kEncoder:
      return "encoder";
    case LayerRole::kDecoder:
      return "decoder";
    case LayerRole::kDraft:
      return "draft";
  }
  return "?";
}

absl::string_view AttentionModeName(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kSwaOnly:
      return "swa";
    case AttentionMode::kFull:
      return "full";
    case AttentionMode::kReindex:
      return "reindex";
    case AttentionMode::kReuse:
      return "reuse";
  }
  return "?";
}

std::vector<int64_t> LayerSchedule::FullLayers() const {
  std::vector<int64_t> out;
  for (const LayerPlan& l : layers) {
    if (l.stores_global_kv()) out.push_back(l.index);
  }
  return out;
}

absl::StatusOr<LayerSchedule> BuildLayerSchedule(const ModelConfig& c) {
  const int64_t trunk = c.num_hidden_layers;
  const int64_t total = c.total_layers();
  if (static_cast<int64_t>(c.compress_ratios.size()) != total) {
    return Invalid(absl::StrCat("compress_ratios has ", c.compress_ratios.size(),
                                " entries, expected ", total, " (num_hidden_layers ", trunk,
                                " + num_nextn_predict_layers ", c.num_nextn_predict_layers, ")"));
  }
  if (trunk % 2 != 0) {
    return Invalid(absl::StrCat("num_hidden_layers is ", trunk,
                                ", must be even (the encoder and the decoder are its halves)"));
  }
  KVC_RETURN_IF_ERROR(CheckShapes(c));
  const char* kTrunk = "layer ids must name an encoder or decoder layer";
  for (auto [key, ids] : {std::pair{"kv_source_layer_ids", &c.kv_source_layer_ids},
                          std::pair{"index_source_layer_ids", &c.index_source_layer_ids},
                          std::pair{"engram_layer_ids", &c.engram_layer_ids},
                          std::pair{"dspark_target_layer_ids", &c.dspark_target_layer_ids}}) {
    KVC_RETURN_IF_ERROR(CheckLayerIds(key, *ids, trunk, kTrunk));
  }
  if (c.candidate_source_layer_id >= trunk) {
    return Invalid(absl::StrCat("candidate_source_layer_id is ", c.candidate_source_layer_id,
                                ", outside [0, ", trunk, ")"));
  }
  for (int64_t id : c.kv_source_layer_ids) {
    if (c.compress_ratios[id] == 0) {
      return Invalid(absl::StrCat("kv_source_layer_ids contains layer ", id,
                                  " but compress_ratios[", id,
                                  "] is 0 (a KV source must have a compress ratio > 0)"));
    }
    if (!Contains(c.index_source_layer_ids, id)) {
      return Invalid(absl::StrCat("kv_source_layer_ids contains layer ", id,
                                  " but index_source_layer_ids does not (a Full layer runs its "
                                  "own indexer)"));
    }
  }
  for (int64_t id : c.index_source_layer_ids) {
    if (c.compress_ratios[id] == 0) {
      return Invalid(absl::StrCat("index_source_layer_ids contains layer ", id,
                                  " but compress_ratios[", id, "] is 0"));
    }
  }

  LayerSchedule s;
  s.encoder_layers = trunk / 2;
  s.decoder_layers = trunk / 2;
  s.draft_layers = c.num_nextn_predict_layers;
  s.layers.resize(total);
  for (int64_t i = 0; i < total; ++i) {
    LayerPlan& l = s.layers[i];
    l.index = i;
    l.role = i < trunk / 2 ? LayerRole::kEncoder
             : i < trunk   ? LayerRole::kDecoder
                           : LayerRole::kDraft;
    l.compress_ratio = c.compress_ratios[i];
    l.has_engram = Contains(c.engram_layer_ids, i);
    l.is_dspark_target = Contains(c.dspark_target_layer_ids, i);
    if (l.role == LayerRole::kDraft && l.compress_ratio != 0) {
      return Invalid(absl::StrCat("compress_ratios[", i, "] is ", l.compress_ratio, " but layer ",
                                  i,
                                  " is a draft layer (DSpark layers keep only a sliding window)"));
    }
    if (l.compress_ratio == 0) continue;  // SWA only

    auto is_full = [](const LayerPlan& p) { return p.mode == AttentionMode::kFull; };
    auto is_indexer = [](const LayerPlan& p) { return p.runs_indexer(); };
    if (Contains(c.kv_source_layer_ids, i)) {
      l.mode = AttentionMode::kFull;
      l.kv_layer = l.index_k_layer = l.topk_layer = i;
    } else {
      l.mode =
          Contains(c.index_source_layer_ids, i) ? AttentionMode::kReindex : AttentionMode::kReuse;
      l.kv_layer = NearestEarlier(s.layers, i, is_full);
      if (l.kv_layer < 0) {
        return Invalid(absl::StrCat("layer ", i, " (", AttentionModeName(l.mode),
                                    ", compress_ratios[", i, "] = ", l.compress_ratio,
                                    ") has no earlier Full layer in kv_source_layer_ids to take "
                                    "its KV from"));
      }
      if (l.mode == AttentionMode::kReindex) {
        l.index_k_layer = l.kv_layer;
        l.topk_layer = i;
      } else {
        l.topk_layer = NearestEarlier(s.layers, i, is_indexer);
      }
    }
    // Shared KV and top-k index compressed positions, so producer and consumer must
    // compress by the same ratio.
    for (int64_t src : {l.kv_layer, l.topk_layer}) {
      if (c.compress_ratios[src] != l.compress_ratio) {
        return Invalid(absl::StrCat("layer ", i, " has compress_ratios[", i,
                                    "] = ", l.compress_ratio, " but its source layer ", src,
                                    " has compress_ratios[", src, "] = ", c.compress_ratios[src]));
      }
    }
    l.is_candidate_source = i == c.candidate_source_layer_id;
    if (l.is_candidate_source && l.mode != AttentionMode::kFull) {
      return Invalid(absl::StrCat("candidate_source_layer_id is ", i,
                                  ", which is not a Full layer (kv_source_layer_ids)"));
    }
    if (l.runs_indexer() && i > c.candidate_source_layer_id) {
      l.candidate_pool_layer = c.candidate_source_layer_id;
      if (c.compress_ratios[c.candidate_source_layer_id] != l.compress_ratio) {
        return Invalid(absl::StrCat("layer ", i, " scores inside the candidate pool of layer ",
                                    c.candidate_source_layer_id,
                                    " but their compress ratios differ (", l.compress_ratio, " vs ",
                                    c.compress_ratios[c.candidate_source_layer_id], ")"));
      }
    }
  }
  if (c.compress_ratios[c.candidate_source_layer_id] == 0 ||
      !Contains(c.kv_source_layer_ids, c.candidate_source_layer_id)) {
    return Invalid(absl::StrCat("candidate_source_layer_id is ", c.candidate_source_layer_id,
                                ", which is not a Full layer (kv_source_layer_ids)"));
  }
  return s;
}

}  // namespace kvc
