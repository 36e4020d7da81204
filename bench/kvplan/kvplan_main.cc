// kvplan: capacity planner for the global-KV cache of a V4.1 Flash model.
//
//   kvplan --config FILE [--context-tokens N] [--sessions N] [--hbm GiB] [--ram GiB]
//          [--ssd TiB] [--chunk-tokens C] [--json]
#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "bench/kvplan/capacity.h"

namespace kvc {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"kvplan: how many sessions of a V4.1 Flash model's global KV fit in each tier"};
  std::string config_path;
  int64_t context_tokens = 0;
  double sessions_per_day = 10000, hbm_gib = 64, ram_gib = 512, ssd_tib = 8;
  int64_t chunk_tokens = kDefaultChunkTokens;
  bool json = false;
  app.add_option("--config", config_path, "model config.json (Hugging Face format)")->required();
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
  app.add_flag("--json", json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvplan: error: " << e.what() << " (run kvplan --help)\n";
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
