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
#include "bench/kvplan/capacity.h"
#include "bench/kvplan/cluster_sim.h"
#include "bench/kvplan/decode_flops.h"
#include "bench/kvplan/simulate.h"

namespace kvc {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"kvplan: how many sessions of a V4.1 Flash model's global KV fit in each tier"};
  std::string config_path;
  int64_t context_tokens = 0;
  double sessions_per_day = 10000, hbm_gib = 64, ram_gib = 512, ssd_tib = 8;
  int64_t nodes = 1, replicas = 1;
  double rados_tib = 0, rados_gbps = 3.125, repair_mbps = 200;
  int64_t chunk_tokens = kDefaultChunkTokens;
  bool json = false;
  app.add_option("--config", config_path, "model config.json (Hugging Face format)");
  app.add_option("--context-tokens", context_tokens,
                 "tokens per session (default: the config's max_position_embeddings)")
      ->check(CLI::PositiveNumber);
  app.add_option("--sessions", sessions_per_day, "new sessions per day written to SSD")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--hbm", hbm_gib, "GPU memory for the cache, GiB")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--ram", ram_gib, "host RAM for the cache, GiB")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--ssd", ssd_tib, "SSD for the cache, TiB")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--chunk-tokens", chunk_tokens, "tokens per cached chunk")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--nodes", nodes, "nodes in the fleet (the tiers above are each node's)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--replicas", replicas, "copies of a chunk on the nodes' SSDs (R)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rados", rados_tib,
                 "a shared RADOS pool under the fleet, TiB usable (0: none; docs/rados.md)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rados-gbps", rados_gbps,
                 "one node's bandwidth to RADOS, GB/s (3.125: a 25 GbE link)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--repair-mbps", repair_mbps,
                 "node-to-node repair bandwidth, MB/s (kvcached --repair-mbps)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--json", json, "print one JSON object");
  CLI::App* simulate = app.add_subcommand(
      "simulate", "replay a request trace through the cache's tiers at given sizes");
  SimulateOptions so;
  std::string sim_config;
  simulate->add_option("--trace", so.trace, "Mooncake trace or agent-session JSON lines")
      ->required();
  simulate->add_option("--config", sim_config, "model config.json")->required();
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
  ClusterSimOptions co;
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
  simulate->add_flag("--json", json, "print one JSON object");
  CLI::App* flops = app.add_subcommand(
      "flops", "the work of one decoded token by component (multiply-adds) at each context");
  std::string flops_config;
  std::vector<int64_t> flops_contexts = {4096, 16384, 65536, 262144, 1048576};
  flops->add_option("--config", flops_config, "model config.json")->required();
  flops->add_option("--contexts", flops_contexts, "context lengths, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  flops->add_flag("--json", json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvplan: error: " << e.what() << " (run kvplan --help)\n";
    return 2;
  }

  if (flops->parsed()) {
    absl::StatusOr<ModelConfig> config = LoadModelConfig(flops_config);
    absl::StatusOr<std::vector<DecodeWork>> rows =
        config.ok() ? DecodeWorkAt(*config, flops_contexts)
                    : absl::StatusOr<std::vector<DecodeWork>>(config.status());
    if (!rows.ok()) {
      std::cerr << "kvplan: error: " << flops_config << ": " << rows.status().message() << "\n";
      return 1;
    }
    const std::string name = std::filesystem::path(flops_config).filename().string();
    std::cout << (json ? DecodeWorkToJson(name, *rows).dump(2) + "\n"
                       : DecodeWorkToText(name, *rows));
    return 0;
  }
  if (simulate->parsed() && co.nodes > 0) {
    absl::StatusOr<ModelConfig> config = LoadModelConfig(sim_config);
    absl::StatusOr<nlohmann::json> r = config.ok()
                                           ? RunClusterSimulate(*config, so, co)
                                           : absl::StatusOr<nlohmann::json>(config.status());
    if (!r.ok()) {
      std::cerr << "kvplan: error: " << r.status().message() << "\n";
      return 1;
    }
    std::cout << (json ? r->dump(2) + "\n" : ClusterSimulateToText(*r));
    return 0;
  }
  if (simulate->parsed()) {
    absl::StatusOr<ModelConfig> config = LoadModelConfig(sim_config);
    absl::StatusOr<nlohmann::json> r =
        config.ok() ? RunSimulate(*config, so) : absl::StatusOr<nlohmann::json>(config.status());
    if (!r.ok()) {
      std::cerr << "kvplan: error: " << r.status().message() << "\n";
      return 1;
    }
    std::cout << (json ? r->dump(2) + "\n" : SimulateToText(*r));
    return 0;
  }
  if (config_path.empty()) {
    std::cerr << "kvplan: error: --config is required (run kvplan --help)\n";
    return 2;
  }
  absl::StatusOr<ModelConfig> config = LoadModelConfig(config_path);
  if (!config.ok()) {
    std::cerr << "kvplan: error: " << config.status().message() << "\n";
    return 1;
  }
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  Workload w;
  w.context_tokens = context_tokens > 0 ? context_tokens : config->max_position_embeddings;
  w.sessions_per_day = sessions_per_day;
  w.chunk_tokens = chunk_tokens;
  w.hbm_bytes = hbm_gib * kGiB;
  w.ram_bytes = ram_gib * kGiB;
  w.ssd_bytes = ssd_tib * kGiB * 1024;
  w.nodes = nodes;
  w.replicas = replicas;
  w.rados_bytes = rados_tib * kGiB * 1024;
  w.rados_node_bytes_per_s = rados_gbps * 1e9;
  w.repair_bytes_per_s = repair_mbps * 1e6;
  absl::StatusOr<CapacityPlan> plan = PlanCapacity(*config, w);
  if (!plan.ok()) {
    std::cerr << "kvplan: error: " << config_path << ": " << plan.status().message() << "\n";
    return 1;
  }
  if (json) {
    std::cout << PlanToJson(*plan).dump(2) << "\n";
  } else {
    std::cout << PlanToText(*plan);
  }
  return 0;
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) { return kvc::Main(argc, argv); }
