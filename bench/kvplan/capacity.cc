#include "bench/kvplan/capacity.h"

#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace kvc {
namespace {

std::string StoresInWords(const LayerPlan& l, const ChunkLayout& layout) {
  switch (l.mode) {
    case AttentionMode::kSwaOnly:
      return "nothing: sliding window only (rebuilt by replay)";
    case AttentionMode::kFull:
      return absl::StrFormat("main KV %d B + index K %d B per %d token%s", layout.entry.main,
                             layout.entry.index, l.compress_ratio, l.compress_ratio > 1 ? "s" : "");
    case AttentionMode::kReindex:
      return absl::StrFormat("nothing: own indexer over L%d's index K", l.index_k_layer);
    case AttentionMode::kReuse:
      return absl::StrFormat("nothing: reuses L%d's KV and L%d's top-k", l.kv_layer, l.topk_layer);
  }
  return "";
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", b) : absl::StrFormat("%.2f %s", b, units[u]);
}

}  // namespace

FleetPlan PlanFleet(const Workload& w, double session_bytes) {
  FleetPlan f;
  f.rados = w.rados_bytes > 0;
  const double nodes = static_cast<double>(std::max<int64_t>(w.nodes, 1));
  f.new_bytes_per_day = nodes * w.sessions_per_day * session_bytes;
  // A node's SSD holds its share of R copies: what it held alone is lost with it when
  // R = 1; otherwise its share is copied back from the other owners.
  const double node_sessions = std::floor(w.ssd_bytes / session_bytes);
  f.lost_sessions_without = w.replicas <= 1 ? static_cast<int64_t>(node_sessions) : 0;
  f.repair_bytes_without = w.replicas <= 1 ? 0 : w.ssd_bytes;
  f.repair_s_without = w.repair_bytes_per_s > 0 ? f.repair_bytes_without / w.repair_bytes_per_s : 0;
  if (!f.rados) return f;
  f.rados_sessions = static_cast<int64_t>(std::floor(w.rados_bytes / session_bytes));
  f.rados_retention_days = f.new_bytes_per_day > 0 ? w.rados_bytes / f.new_bytes_per_day : 0;
  f.node_write_bytes_per_s = w.sessions_per_day * session_bytes / 86400.0;
  if (w.rados_node_bytes_per_s > 0) {
    f.resume_from_rados_s = session_bytes / w.rados_node_bytes_per_s;
    // Durable chunks are in RADOS: nothing is lost, repair copies none of them, and the
    // node's successor reads the hot set back as it is asked for it.
    f.refill_bytes_with = w.ram_bytes;
    f.refill_s_with = w.ram_bytes / w.rados_node_bytes_per_s;
  }
  f.lost_sessions_with = 0;
  return f;
}

absl::StatusOr<CapacityPlan> PlanCapacity(const ModelConfig& config, const Workload& w) {
  CapacityPlan p;
  p.config = config;
  p.workload = w;
  KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(config));
  p.schedule = std::move(schedule);
  KVC_ASSIGN_OR_RETURN(ChunkLayout layout, BuildChunkLayout(config, p.schedule, w.chunk_tokens));
  p.layout = std::move(layout);
  if (w.context_tokens < w.chunk_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("context of ", w.context_tokens, " tokens is shorter than one chunk (",
                     w.chunk_tokens, " tokens): nothing would be cached"));
  }

  p.active = model::CountActiveParameters(config, p.schedule);
  for (const LayerPlan& l : p.schedule.layers) {
    p.layers.push_back({l.index, std::string(LayerRoleName(l.role)),
                        std::string(AttentionModeName(l.mode)), l.compress_ratio,
                        p.layout.LayerBytesPerToken(l.index), StoresInWords(l, p.layout)});
  }
  p.cached_chunks_per_session = w.context_tokens / w.chunk_tokens;
  p.uncached_tail_tokens = w.context_tokens % w.chunk_tokens;
  p.session_bytes = static_cast<double>(p.cached_chunks_per_session * p.layout.chunk_bytes);
  for (auto [tier, capacity] : {std::pair{"hbm", w.hbm_bytes}, std::pair{"ram", w.ram_bytes},
                                std::pair{"ssd", w.ssd_bytes}}) {
    p.tiers.push_back(
        {tier, capacity, static_cast<int64_t>(std::floor(capacity / p.session_bytes))});
  }
  p.ssd_write_bytes_per_day = w.sessions_per_day * p.session_bytes;
  p.ssd_drive_writes_per_day = w.ssd_bytes > 0 ? p.ssd_write_bytes_per_day / w.ssd_bytes : 0;
  p.fleet = PlanFleet(w, p.session_bytes);
  p.bounded_replay_tokens = config.sliding_window;
  p.exact_replay_tokens = p.schedule.encoder_layers * config.sliding_window;

  // What the alternatives would keep for the same session.
  const double ctx = static_cast<double>(w.context_tokens);
  const double ours = p.layout.bytes_per_token();
  const double swa_row = static_cast<double>(PackedBytes(KvFormat::kSwaKv, config.head_dim));
  const double windowed_layers = static_cast<double>(config.total_layers());
  const double mha =
      2.0 * static_cast<double>(config.num_attention_heads * config.head_dim *
                                config.activation_dtype_bytes() * config.num_hidden_layers);
  const double swa_per_token = swa_row * windowed_layers;
  const double snapshot_per_token = swa_per_token * static_cast<double>(config.sliding_window) /
                                    static_cast<double>(w.chunk_tokens);
  auto alt = [&](std::string name, std::string description, double per_token) {
    p.alternatives.push_back({std::move(name), std::move(description), per_token, per_token * ctx});
  };
  alt("kvcache", "FP4 global KV of the Full layers; SWA rebuilt by bounded replay", ours);
  alt("with-swa-per-token",
      absl::StrFormat("plus every layer's FP8 window KV for every token (%d layers × %.0f B)",
                      config.total_layers(), swa_row),
      ours + swa_per_token);
  alt("with-swa-snapshot-per-chunk",
      absl::StrFormat("plus a %d-token window snapshot of every layer at each chunk boundary",
                      config.sliding_window),
      ours + snapshot_per_token);
  alt("naive-mha",
      absl::StrFormat("per-layer K and V for all %d heads in %s, %d layers",
                      config.num_attention_heads, config.dtype, config.num_hidden_layers),
      mha);
  alt("mla-style",
      absl::StrFormat("per layer, one latent row of %d plus a %d-wide RoPE key in %s, as "
                      "DeepSeek-V3's MLA caches, %d layers",
                      config.head_dim, config.qk_rope_head_dim, config.dtype,
                      config.num_hidden_layers),
      static_cast<double>((config.head_dim + config.qk_rope_head_dim) *
                          config.activation_dtype_bytes() * config.num_hidden_layers));
  return p;
}

nlohmann::json PlanToJson(const CapacityPlan& p) {
  nlohmann::json j;
  j["model_type"] = p.config.model_type;
  j["global_kv_bytes_per_token"] = p.layout.bytes_per_token();
  j["chunk_tokens"] = p.layout.chunk_tokens;
  j["chunk_bytes"] = p.layout.chunk_bytes;
  j["kv_layout_version"] = kKvLayoutVersion;
  j["entry_bytes"] = {{"main", p.layout.entry.main}, {"index", p.layout.entry.index}};
  j["layers"] = nlohmann::json::array();
  for (const LayerStorage& l : p.layers) {
    const LayerPlan& plan = p.schedule.layers[l.index];
    j["layers"].push_back({{"index", l.index},
                           {"role", l.role},
                           {"ratio", l.ratio},
                           {"mode", l.mode},
                           {"stored_bytes_per_token", l.stored_bytes_per_token},
                           {"kv_layer", plan.kv_layer},
                           {"index_k_layer", plan.index_k_layer},
                           {"topk_layer", plan.topk_layer},
                           {"candidate_source", plan.is_candidate_source},
                           {"candidate_pool_layer", plan.candidate_pool_layer},
                           {"engram", plan.has_engram},
                           {"dspark_target", plan.is_dspark_target},
                           {"stores", l.stores}});
  }
  j["session"] = {{"context_tokens", p.workload.context_tokens},
                  {"cached_chunks", p.cached_chunks_per_session},
                  {"uncached_tail_tokens", p.uncached_tail_tokens},
                  {"bytes", p.session_bytes},
                  {"bounded_replay_tokens", p.bounded_replay_tokens},
                  {"exact_replay_tokens", p.exact_replay_tokens}};
  j["sessions_fit"] = nlohmann::json::object();
  j["tier_capacity_bytes"] = nlohmann::json::object();
  for (const TierFit& t : p.tiers) {
    j["sessions_fit"][t.tier] = t.sessions;
    j["tier_capacity_bytes"][t.tier] = t.capacity_bytes;
  }
  j["ssd"] = {{"sessions_per_day", p.workload.sessions_per_day},
              {"write_bytes_per_day", p.ssd_write_bytes_per_day},
              {"drive_writes_per_day", p.ssd_drive_writes_per_day}};
  if (p.workload.nodes > 1 || p.fleet.rados) {
    const FleetPlan& f = p.fleet;
    j["fleet"] = {{"nodes", p.workload.nodes},
                  {"replicas", p.workload.replicas},
                  {"new_bytes_per_day", f.new_bytes_per_day},
                  {"node_loss_without_rados",
                   {{"sessions_lost", f.lost_sessions_without},
                    {"repair_bytes", f.repair_bytes_without},
                    {"repair_seconds", f.repair_s_without}}}};
    if (f.rados) {
      j["fleet"]["rados"] = {{"capacity_bytes", p.workload.rados_bytes},
                             {"sessions_fit", f.rados_sessions},
                             {"retention_days", f.rados_retention_days},
                             {"node_write_bytes_per_s", f.node_write_bytes_per_s},
                             {"node_bytes_per_s", p.workload.rados_node_bytes_per_s},
                             {"resume_seconds", f.resume_from_rados_s}};
      j["fleet"]["node_loss_with_rados"] = {{"sessions_lost", f.lost_sessions_with},
                                            {"repair_bytes", 0},
                                            {"refill_bytes", f.refill_bytes_with},
                                            {"refill_seconds", f.refill_s_with}};
    }
  }
  j["active_parameters"] = {{"total", p.active.total},
                            {"per_decode_token", p.active.decode},
                            {"per_prefill_token_ced", p.active.prefill_ced},
                            {"per_prefill_token_full_depth", p.active.prefill_full},
                            {"dspark_per_draft_row", p.active.drafter}};
  j["alternatives"] = nlohmann::json::array();
  for (const Alternative& a : p.alternatives) {
    nlohmann::json fits = nlohmann::json::object();
    for (const TierFit& t : p.tiers)
      fits[t.tier] = static_cast<int64_t>(std::floor(t.capacity_bytes / a.session_bytes));
    j["alternatives"].push_back({{"name", a.name},
                                 {"description", a.description},
                                 {"bytes_per_token", a.bytes_per_token},
                                 {"session_bytes", a.session_bytes},
                                 {"times_kvcache", a.bytes_per_token / p.layout.bytes_per_token()},
                                 {"sessions_fit", fits}});
  }
  return j;
}

namespace {

std::string Seconds(double s) {
  if (s < 120) return absl::StrFormat("%.1f s", s);
  if (s < 7200) return absl::StrFormat("%.1f min", s / 60);
  return absl::StrFormat("%.1f h", s / 3600);
}

std::string FleetToText(const CapacityPlan& p) {
  const Workload& w = p.workload;
  const FleetPlan& f = p.fleet;
  std::string out = absl::StrFormat(
      "Fleet of %d nodes, R = %d on their SSDs%s: %s of new sessions/day (stored once each)\n",
      w.nodes, w.replicas,
      f.rados ? absl::StrCat(", a RADOS pool of ", Bytes(w.rados_bytes), " under them") : "",
      Bytes(f.new_bytes_per_day));
  if (f.rados) {
    absl::StrAppendFormat(&out,
                          "  RADOS holds %d sessions: %.1f days of the fleet's new sessions\n",
                          f.rados_sessions, f.rados_retention_days);
    absl::StrAppendFormat(&out, "  each node writes %s/s to it on average",
                          Bytes(f.node_write_bytes_per_s));
    if (w.rados_node_bytes_per_s > 0) {
      absl::StrAppendFormat(&out, " (%.1f %% of its %s/s); a whole session resumes from it in %s\n",
                            100 * f.node_write_bytes_per_s / w.rados_node_bytes_per_s,
                            Bytes(w.rados_node_bytes_per_s), Seconds(f.resume_from_rados_s));
    } else {
      out += "\n";
    }
  }
  absl::StrAppendFormat(&out, "  %-24s  %-30s  %s\n", "one node lost", "nodes alone",
                        f.rados ? "with RADOS" : "");
  absl::StrAppendFormat(
      &out, "  %-24s  %-30s  %s\n", "sessions without a copy",
      absl::StrCat(f.lost_sessions_without, w.replicas <= 1 ? " (R = 1: its SSD's)" : ""),
      f.rados ? "0 (every durable chunk is in RADOS)" : "");
  absl::StrAppendFormat(
      &out, "  %-24s  %-30s  %s\n", "repair copies",
      w.replicas <= 1
          ? std::string("none (nothing left to copy)")
          : absl::StrCat(Bytes(f.repair_bytes_without), " in ",
                         w.repair_bytes_per_s > 0 ? Seconds(f.repair_s_without) : std::string("?")),
      f.rados ? "none (owners read RADOS when asked)" : "");
  if (f.rados && w.rados_node_bytes_per_s > 0) {
    absl::StrAppendFormat(&out, "  %-24s  %-30s  %s\n", "hot set back", "-",
                          absl::StrCat(Bytes(f.refill_bytes_with), " (its RAM) in ",
                                       Seconds(f.refill_s_with), ", read as asked"));
  }
  out += "\n";
  return out;
}

}  // namespace

std::string PlanToText(const CapacityPlan& p) {
  std::string out;
  const Workload& w = p.workload;
  absl::StrAppendFormat(&out, "Global KV: %.2f B/token = %d B per %d-token chunk (layout v%d)\n",
                        p.layout.bytes_per_token(), p.layout.chunk_bytes, p.layout.chunk_tokens,
                        kKvLayoutVersion);
  absl::StrAppendFormat(
      &out,
      "  per compressed position: main KV %d B (E2M1 + E4M3/16), index K %d B (E2M1 + E8M0/32)\n\n",
      p.layout.entry.main, p.layout.entry.index);
  absl::StrAppendFormat(&out, "%5s  %-7s  %5s  %-7s  %9s  %s\n", "layer", "role", "ratio", "mode",
                        "B/token", "stores");
  for (const LayerStorage& l : p.layers) {
    absl::StrAppendFormat(&out, "%5d  %-7s  %5d  %-7s  %9.2f  %s\n", l.index, l.role, l.ratio,
                          l.mode, l.stored_bytes_per_token, l.stores);
  }
  absl::StrAppendFormat(&out,
                        "\nActive parameters per token: decode %.2fB, prefill %.2fB with CED "
                        "(%.2fB at full depth); %.1fB in all, DSpark drafter %.2fB per row\n",
                        p.active.decode / 1e9, p.active.prefill_ced / 1e9,
                        p.active.prefill_full / 1e9, p.active.total / 1e9, p.active.drafter / 1e9);
  absl::StrAppendFormat(&out,
                        "Session of %d tokens: %d chunks cached (%d tail tokens recomputed), %s\n",
                        w.context_tokens, p.cached_chunks_per_session, p.uncached_tail_tokens,
                        Bytes(p.session_bytes));
  absl::StrAppendFormat(
      &out, "Resume replays %d tokens (bounded) or %d (exact: %d encoder layers × window)\n\n",
      p.bounded_replay_tokens, p.exact_replay_tokens, p.schedule.encoder_layers);
  absl::StrAppendFormat(&out, "%-5s  %12s  %16s\n", "tier", "capacity", "sessions fit");
  for (const TierFit& t : p.tiers) {
    absl::StrAppendFormat(&out, "%-5s  %12s  %16d\n", t.tier, Bytes(t.capacity_bytes), t.sessions);
  }
  absl::StrAppendFormat(
      &out, "\nSSD writes at %.0f new sessions/day: %s/day (%.3f drive writes/day)\n\n",
      w.sessions_per_day, Bytes(p.ssd_write_bytes_per_day), p.ssd_drive_writes_per_day);
  if (w.nodes > 1 || p.fleet.rados) out += FleetToText(p);
  absl::StrAppendFormat(&out, "%-28s  %12s  %12s  %9s  %10s  %s\n", "keeping the session as",
                        "B/token", "per session", "× ours", "fit on SSD", "what");
  for (const Alternative& a : p.alternatives) {
    absl::StrAppendFormat(&out, "%-28s  %12.1f  %12s  %9.1f  %10d  %s\n", a.name, a.bytes_per_token,
                          Bytes(a.session_bytes), a.bytes_per_token / p.layout.bytes_per_token(),
                          static_cast<int64_t>(std::floor(w.ssd_bytes / a.session_bytes)),
                          a.description);
  }
  return out;
}

}  // namespace kvc
