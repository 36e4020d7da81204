// kvplan: capacity planner for the global-KV cache of a V4.1 Flash model.
//
//   kvplan --config FILE [--context-tokens N] [--sessions N] [--hbm GiB] [--ram GiB]
//          [--ssd TiB] [--chunk-tokens C] [--nodes N --replicas R --rados TiB
//          --rados-gbps G --repair-mbps M] [--json]
//   kvplan simulate --trace FILE --config FILE [--hbm GiB] [--ram GiB] [--ssd GiB]
//          [--chunk-tokens C] [--limit N] [--target-hit-rate R] [--curve-points N] [--json]
//          [--nodes N [--replicas R] [--fail-node-at HOURS …] [--rados]]   (cluster_sim.h)
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/kvplan/capacity.h"
#include "bench/kvplan/cluster_sim.h"
#include "bench/kvplan/decode_flops.h"
#include "bench/kvplan/simulate.h"
#include "programs/command_line.h"

namespace kvc {
namespace {

struct Flags {
  // The capacity plan (no subcommand).
  std::string config_path;
  int64_t context_tokens = 0;
  double sessions_per_day = 10000, hbm_gib = 64, ram_gib = 512, ssd_tib = 8;
  int64_t nodes = 1, replicas = 1;
  double rados_tib = 0, rados_gbps = 3.125, repair_mbps = 200;
  int64_t chunk_tokens = kDefaultChunkTokens;
  // kvplan simulate
  SimulateOptions so;
  ClusterSimOptions co;
  std::string sim_config;
  // kvplan flops
  std::string flops_config;
  std::vector<int64_t> flops_contexts = {4096, 16384, 65536, 262144, 1048576};
  bool json = false;
};

void AddPlanFlags(CLI::App& app, Flags& f) {
  app.add_option("--config", f.config_path, "model config.json (Hugging Face format)");
  app.add_option("--context-tokens", f.context_tokens,
                 "tokens per session (default: the config's max_position_embeddings)")
      ->check(CLI::PositiveNumber);
  auto size = [&](const char* name, double& v, const char* help) {
    app.add_option(name, v, help)->check(CLI::NonNegativeNumber)->capture_default_str();
  };
  size("--sessions", f.sessions_per_day, "new sessions per day written to SSD");
  size("--hbm", f.hbm_gib, "GPU memory for the cache, GiB");
  size("--ram", f.ram_gib, "host RAM for the cache, GiB");
  size("--ssd", f.ssd_tib, "SSD for the cache, TiB");
  app.add_option("--chunk-tokens", f.chunk_tokens, "tokens per cached chunk")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--nodes", f.nodes, "nodes in the fleet (the tiers above are each node's)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--replicas", f.replicas, "copies of a chunk on the nodes' SSDs (R)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  size("--rados", f.rados_tib,
       "a shared RADOS pool under the fleet, TiB usable (0: none; docs/rados.md)");
  size("--rados-gbps", f.rados_gbps, "one node's bandwidth to RADOS, GB/s (3.125: a 25 GbE link)");
  size("--repair-mbps", f.repair_mbps,
       "node-to-node repair bandwidth, MB/s (kvcached --repair-mbps)");
  app.add_flag("--json", f.json, "print one JSON object");
}

CLI::App* AddSimulateFlags(CLI::App& app, Flags& f) {
  CLI::App* simulate = app.add_subcommand(
      "simulate", "replay a request trace through the cache's tiers at given sizes");
  SimulateOptions& so = f.so;
  simulate->add_option("--trace", so.trace, "Mooncake trace or agent-session JSON lines")
      ->required();
  simulate->add_option("--config", f.sim_config, "model config.json")->required();
  simulate->add_option("--hbm", so.hbm_gib, "GPU memory, GiB (negative: unlimited)")
      ->capture_default_str();
  simulate->add_option("--ram", so.ram_gib, "host RAM, GiB (negative: unlimited)")
      ->capture_default_str();
  simulate->add_option("--ssd", so.ssd_gib, "SSD, GiB (negative: unlimited)")
      ->capture_default_str();
  simulate->add_option("--chunk-tokens", so.chunk_tokens, "tokens per cached chunk")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  simulate->add_option("--limit", so.limit, "the first N requests only")
      ->check(CLI::NonNegativeNumber);
  simulate
      ->add_option("--target-hit-rate", so.target_hit_rate,
                   "also find the smallest RAM (no SSD) and SSD (beside --ram) reaching it")
      ->check(CLI::Range(0.0, 1.0));
  simulate
      ->add_option("--curve-points", so.curve_points,
                   "also the hit rate at N RAM and N SSD sizes (for plots)")
      ->check(CLI::NonNegativeNumber);
  ClusterSimOptions& co = f.co;
  simulate
      ->add_option("--nodes", co.nodes,
                   "simulate a cluster of N nodes (--ram and --ssd are then per node)")
      ->check(CLI::PositiveNumber);
  simulate->add_option("--replicas", co.replicas, "copies of each chunk in the cluster")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  simulate
      ->add_option("--fail-node-at", co.fail_at_hours,
                   "HOURS after the first request, the fullest live node dies (repeatable)")
      ->check(CLI::NonNegativeNumber);
  simulate->add_flag("--rados", co.rados,
                     "with --nodes: also a shared RADOS tier below the nodes (every chunk "
                     "stored kept there; a node's loss loses nothing)");
  simulate->add_flag("--json", f.json, "print one JSON object");
  return simulate;
}

CLI::App* AddFlopsFlags(CLI::App& app, Flags& f) {
  CLI::App* flops = app.add_subcommand(
      "flops", "the work of one decoded token by component (multiply-adds) at each context");
  flops->add_option("--config", f.flops_config, "model config.json")->required();
  flops->add_option("--contexts", f.flops_contexts, "context lengths, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  flops->add_flag("--json", f.json, "print one JSON object");
  return flops;
}

// Each command returns what it prints, or an error naming what was wrong.
absl::StatusOr<std::string> RunFlops(const Flags& f) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(f.flops_config);
  absl::StatusOr<std::vector<DecodeWork>> rows =
      config.ok() ? DecodeWorkAt(*config, f.flops_contexts)
                  : absl::StatusOr<std::vector<DecodeWork>>(config.status());
  if (!rows.ok()) {
    return absl::Status(rows.status().code(),
                        absl::StrCat(f.flops_config, ": ", rows.status().message()));
  }
  const std::string name = std::filesystem::path(f.flops_config).filename().string();
  return f.json ? DecodeWorkToJson(name, *rows).dump(2) + "\n" : DecodeWorkToText(name, *rows);
}

absl::StatusOr<std::string> RunSimulation(const Flags& f) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(f.sim_config));
  if (f.co.nodes > 0) {
    KVC_ASSIGN_OR_RETURN(nlohmann::json r, RunClusterSimulate(config, f.so, f.co));
    return f.json ? r.dump(2) + "\n" : ClusterSimulateToText(r);
  }
  KVC_ASSIGN_OR_RETURN(nlohmann::json r, RunSimulate(config, f.so));
  return f.json ? r.dump(2) + "\n" : SimulateToText(r);
}

absl::StatusOr<std::string> RunPlan(const Flags& f) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(f.config_path));
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  Workload w;
  w.context_tokens = f.context_tokens > 0 ? f.context_tokens : config.max_position_embeddings;
  w.sessions_per_day = f.sessions_per_day;
  w.chunk_tokens = f.chunk_tokens;
  w.hbm_bytes = f.hbm_gib * kGiB;
  w.ram_bytes = f.ram_gib * kGiB;
  w.ssd_bytes = f.ssd_tib * kGiB * 1024;
  w.nodes = f.nodes;
  w.replicas = f.replicas;
  w.rados_bytes = f.rados_tib * kGiB * 1024;
  w.rados_node_bytes_per_s = f.rados_gbps * 1e9;
  w.repair_bytes_per_s = f.repair_mbps * 1e6;
  absl::StatusOr<CapacityPlan> plan = PlanCapacity(config, w);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat(f.config_path, ": ", plan.status().message()));
  }
  return f.json ? PlanToJson(*plan).dump(2) + "\n" : PlanToText(*plan);
}

int Main(int argc, char** argv) {
  CLI::App app{"kvplan: how many sessions of a V4.1 Flash model's global KV fit in each tier"};
  Flags f;
  AddPlanFlags(app, f);
  CLI::App* simulate = AddSimulateFlags(app, f);
  CLI::App* flops = AddFlopsFlags(app, f);
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvplan")) return *stop;
  if (!flops->parsed() && !simulate->parsed() && f.config_path.empty()) {
    std::cerr << "kvplan: error: --config is required (run kvplan --help)\n";
    return 2;
  }
  const absl::StatusOr<std::string> out = flops->parsed()      ? RunFlops(f)
                                          : simulate->parsed() ? RunSimulation(f)
                                                               : RunPlan(f);
  if (!out.ok()) {
    std::cerr << "kvplan: error: " << out.status().message() << "\n";
    return 1;
  }
  std::cout << *out;
  return 0;
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) { return kvc::Main(argc, argv); }
