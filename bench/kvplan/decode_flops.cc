#include "bench/kvplan/decode_flops.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "engine/model/weights.h"
#include "engine/spec/layer_schedule.h"

namespace kvc {

absl::StatusOr<std::vector<DecodeWork>> DecodeWorkAt(const ModelConfig& c,
                                                     const std::vector<int64_t>& contexts) {
  KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(c));
  // Parameters one decoded token multiplies: the active ones, less the rows it only looks
  // up (its embedding row, its Engram table rows).
  const model::ActiveParameters active = model::CountActiveParameters(c, schedule);
  const double lookups =
      static_cast<double>(c.hidden_size) +
      static_cast<double>(c.engram_layer_ids.size() * (c.engram_max_ngram_size - 1) *
                          c.engram_n_heads * c.engram_head_dim);
  const double H = static_cast<double>(c.num_attention_heads), hd = static_cast<double>(c.head_dim),
               per_index_row = static_cast<double>(c.index_n_heads * c.index_head_dim);
  const double pool = static_cast<double>(c.candidate_topk_blocks * c.candidate_block_size);
  std::vector<DecodeWork> rows;
  for (int64_t ctx : contexts) {
    if (ctx < 1) return absl::InvalidArgumentError(absl::StrCat("context ", ctx, " is < 1"));
    DecodeWork w;
    w.context_tokens = ctx;
    w.dense = active.decode - lookups;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const LayerPlan& p = schedule.layers[l];
      w.window_attention += 2 * H * hd * static_cast<double>(std::min(ctx, c.sliding_window));
      if (p.compress_ratio == 0) continue;
      const double visible = static_cast<double>(ctx / p.compress_ratio);
      w.sparse_attention += 2 * H * hd * std::min(visible, static_cast<double>(c.index_topk));
      if (p.mode == AttentionMode::kFull) w.full_indexers += per_index_row * visible;
      if (p.mode == AttentionMode::kReindex) {
        w.reindex_indexers += per_index_row * std::min(visible, pool);
      }
    }
    rows.push_back(w);
  }
  return rows;
}

nlohmann::json DecodeWorkToJson(const std::string& name, const std::vector<DecodeWork>& rows) {
  nlohmann::json out = {{"model", name}, {"unit", "multiply-adds per decoded token"}};
  for (const DecodeWork& w : rows) {
    out["contexts"].push_back({{"context_tokens", w.context_tokens},
                               {"dense", w.dense},
                               {"window_attention", w.window_attention},
                               {"sparse_attention", w.sparse_attention},
                               {"full_indexers", w.full_indexers},
                               {"reindex_indexers", w.reindex_indexers},
                               {"total", w.total()},
                               {"growth_vs_first", w.total() / rows.front().total()}});
  }
  return out;
}

std::string DecodeWorkToText(const std::string& name, const std::vector<DecodeWork>& rows) {
  std::string s = absl::StrFormat(
      "decode work per token, %s (multiply-adds; GMAC = 1e9)\n%10s %10s %10s %10s %12s %12s "
      "%10s %8s\n",
      name, "context", "dense", "window", "sparse", "full idx", "reindex idx", "total", "growth");
  for (const DecodeWork& w : rows) {
    absl::StrAppendFormat(&s, "%10d %10.4f %10.4f %10.4f %12.4f %12.4f %10.4f %7.2fx\n",
                          w.context_tokens, w.dense / 1e9, w.window_attention / 1e9,
                          w.sparse_attention / 1e9, w.full_indexers / 1e9, w.reindex_indexers / 1e9,
                          w.total() / 1e9, w.total() / rows.front().total());
  }
  return s;
}

}  // namespace kvc
