#include "bench/kvplan/simulate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvplan/capacity.h"
#include "bench/trace/tier_sim.h"
#include "storage/ram_tier.h"
#include "storage/slot_format.h"

namespace kvc {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double Bytes(double gib) { return gib < 0 ? -1 : gib * kGiB; }

// The smallest capacity (bytes, in whole slots of slot_bytes) at which `hit_rate_at`
// reaches `target`, searching up to `most` slots; nullopt if even `most` does not.
template <typename F>
std::optional<double> Smallest(double target, double slot_bytes, int64_t most, F hit_rate_at) {
  if (hit_rate_at(static_cast<double>(most) * slot_bytes) < target) return std::nullopt;
  int64_t lo = 0, hi = most;  // hit_rate_at(hi) >= target
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (hit_rate_at(static_cast<double>(mid) * slot_bytes) >= target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return static_cast<double>(hi) * slot_bytes;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunSimulate(const ModelConfig& config, const SimulateOptions& o) {
  Workload w;
  w.context_tokens = o.chunk_tokens;
  w.chunk_tokens = o.chunk_tokens;
  KVC_ASSIGN_OR_RETURN(CapacityPlan plan, PlanCapacity(config, w));
  KVC_ASSIGN_OR_RETURN(std::vector<trace::Request> requests, trace::ReadTrace(o.trace, o.limit));
  if (requests.empty()) return absl::InvalidArgumentError("trace \"" + o.trace + "\" is empty");
  const auto keys = trace::RequestKeys(
      requests, o.chunk_tokens, static_cast<uint32_t>(config.vocab_size), storage::ChunkKey{});
  const auto simulate = [&](uint64_t chunk_bytes, double hbm, double ram, double ssd) {
    trace::SimConfig c{o.chunk_tokens, chunk_bytes, hbm, ram, ssd};
    return trace::SimulateKeys(requests, keys, c);
  };
  const double hbm = Bytes(o.hbm_gib), ram = Bytes(o.ram_gib), ssd = Bytes(o.ssd_gib);
  const uint64_t ours_chunk = static_cast<uint64_t>(plan.layout.chunk_bytes);

  nlohmann::json j;
  j["trace"] = {
      {"path", o.trace}, {"requests", requests.size()}, {"seconds", trace::TraceSeconds(requests)}};
  j["chunk_tokens"] = o.chunk_tokens;
  j["capacity_bytes"] = {{"hbm", hbm}, {"ram", ram}, {"ssd", ssd}};
  const trace::SimReport ours = simulate(ours_chunk, hbm, ram, ssd);
  j["result"] = trace::ReportToJson(ours);
  j["hit_rate"] = ours.hit_rate;
  const trace::SimReport unlimited = simulate(ours_chunk, -1, -1, -1);
  j["unlimited_hit_rate"] = unlimited.hit_rate;
  // Distinct chunks the trace stores: more capacity than this never helps.
  const int64_t distinct = static_cast<int64_t>(unlimited.stored_chunks);
  j["distinct_chunks"] = distinct;

  j["layouts"] = nlohmann::json::array();
  for (const Alternative& a : plan.alternatives) {
    if (a.name != "kvcache" && a.name != "naive-mha" && a.name != "mla-style") continue;
    const uint64_t chunk = a.name == "kvcache"
                               ? ours_chunk
                               : static_cast<uint64_t>(std::llround(a.bytes_per_token)) *
                                     static_cast<uint64_t>(o.chunk_tokens);
    const trace::SimReport r = a.name == "kvcache" ? ours : simulate(chunk, hbm, ram, ssd);
    j["layouts"].push_back(
        {{"name", a.name},
         {"description", a.description},
         {"bytes_per_token", a.bytes_per_token},
         {"chunk_bytes", chunk},
         {"hit_rate", r.hit_rate},
         {"ram_hit_rate", r.ram.hit_rate},
         {"ssd_hit_rate", r.ssd.hit_rate},
         {"ssd_write_bytes_per_day", r.ssd_write_bytes_per_day},
         {"working_set_bytes", static_cast<double>(distinct) * static_cast<double>(chunk)}});
  }
  const double ram_slot = static_cast<double>(storage::RamSlotBytes(ours_chunk));
  const double ssd_slot = static_cast<double>(storage::SlotBytesFor(ours_chunk));
  if (o.target_hit_rate) {
    const double target = *o.target_hit_rate;
    nlohmann::json t = {{"hit_rate", target}};
    const std::optional<double> ram_only = Smallest(target, ram_slot, distinct, [&](double b) {
      return simulate(ours_chunk, hbm, b, 0).hit_rate;
    });
    const std::optional<double> ssd_need = Smallest(target, ssd_slot, distinct, [&](double b) {
      return simulate(ours_chunk, hbm, ram, b).hit_rate;
    });
    t["smallest_ram_bytes_without_ssd"] = ram_only ? nlohmann::json(*ram_only) : nlohmann::json();
    t["smallest_ssd_bytes_with_this_ram"] = ssd_need ? nlohmann::json(*ssd_need) : nlohmann::json();
    t["reachable"] = unlimited.hit_rate >= target;
    j["target"] = t;
  }
  if (o.curve_points > 0) {
    nlohmann::json ram_curve = nlohmann::json::array(), ssd_curve = nlohmann::json::array();
    for (int i = 1; i <= o.curve_points; ++i) {
      const double frac = static_cast<double>(i) / o.curve_points;
      const double rb = std::floor(frac * static_cast<double>(distinct)) * ram_slot;
      const double sb = std::floor(frac * static_cast<double>(distinct)) * ssd_slot;
      ram_curve.push_back({{"bytes", rb}, {"hit_rate", simulate(ours_chunk, hbm, rb, 0).hit_rate}});
      ssd_curve.push_back(
          {{"bytes", sb}, {"hit_rate", simulate(ours_chunk, hbm, ram, sb).hit_rate}});
    }
    j["curves"] = {{"ram_without_ssd", ram_curve}, {"ssd_with_this_ram", ssd_curve}};
  }
  return j;
}

std::string SimulateToText(const nlohmann::json& j) {
  const auto gib = [](const nlohmann::json& b) {
    return b.is_null()           ? std::string("-")
           : b.get<double>() < 0 ? std::string("unlimited")
                                 : absl::StrFormat("%.2f GiB", b.get<double>() / kGiB);
  };
  std::string out = absl::StrFormat(
      "trace %s: %d requests over %.0f s, %d-token chunks\n"
      "capacities: hbm %s, ram %s, ssd %s\n\n",
      j["trace"]["path"].get<std::string>(), j["trace"]["requests"].get<int64_t>(),
      j["trace"]["seconds"].get<double>(), j["chunk_tokens"].get<int64_t>(),
      gib(j["capacity_bytes"]["hbm"]), gib(j["capacity_bytes"]["ram"]),
      gib(j["capacity_bytes"]["ssd"]));
  const nlohmann::json& r = j["result"];
  absl::StrAppendFormat(&out, "hit rate %.4f (the trace's own, unlimited: %.4f)\n",
                        r["hit_rate"].get<double>(), j["unlimited_hit_rate"].get<double>());
  absl::StrAppendFormat(&out, "%-5s %10s %10s %14s %14s %10s\n", "tier", "hit rate", "chunks",
                        "read GB", "written GB", "evictions");
  for (const char* t : {"hbm", "ram", "ssd"}) {
    const nlohmann::json& x = r["tiers"][t];
    const int64_t cap = x["capacity_chunks"];
    absl::StrAppendFormat(
        &out, "%-5s %10.4f %10s %14.2f %14.2f %10d\n", t, x["hit_rate"].get<double>(),
        cap < 0 ? std::string("unlimited") : absl::StrCat(cap), x["read_bytes"].get<double>() / 1e9,
        x["written_bytes"].get<double>() / 1e9, x["evictions"].get<int64_t>());
  }
  absl::StrAppendFormat(&out, "SSD writes: %.1f GB/day\n\n",
                        r["ssd_write_bytes_per_day"].get<double>() / 1e9);
  absl::StrAppendFormat(&out, "%-10s %12s %12s %10s %14s %16s\n", "layout", "B/token", "chunk B",
                        "hit rate", "SSD GB/day", "working set GiB");
  for (const nlohmann::json& l : j["layouts"]) {
    absl::StrAppendFormat(&out, "%-10s %12.0f %12d %10.4f %14.1f %16.2f\n",
                          l["name"].get<std::string>(), l["bytes_per_token"].get<double>(),
                          l["chunk_bytes"].get<int64_t>(), l["hit_rate"].get<double>(),
                          l["ssd_write_bytes_per_day"].get<double>() / 1e9,
                          l["working_set_bytes"].get<double>() / kGiB);
  }
  if (j.contains("target")) {
    const nlohmann::json& t = j["target"];
    absl::StrAppendFormat(&out,
                          "\nto reach hit rate %.2f: RAM alone %s; SSD beside this RAM %s%s\n",
                          t["hit_rate"].get<double>(), gib(t["smallest_ram_bytes_without_ssd"]),
                          gib(t["smallest_ssd_bytes_with_this_ram"]),
                          t["reachable"].get<bool>() ? "" : " (the trace's own hit rate is lower)");
  }
  return out;
}

}  // namespace kvc
