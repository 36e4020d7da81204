// kvmodel: model files for the engine.
//
//   kvmodel init --config C --seed S --out FILE   deterministic random weights (safetensors)
//   kvmodel check --config C --weights FILE       loads FILE against C (every tensor checked)
//
// The same config and seed always give the same bytes.
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "engine/model/model.h"
#include "engine/model/weights.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"
#include "programs/command_line.h"

namespace kvc {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"kvmodel: weights for the kvcache engine"};
  app.require_subcommand(1);
  std::string config_path, out_path, weights_path;
  uint64_t seed = 0;
  CLI::App* init = app.add_subcommand("init", "write deterministic random weights");
  init->add_option("--config", config_path, "model config.json")->required();
  init->add_option("--seed", seed, "random seed")->required();
  init->add_option("--out", out_path, "safetensors file to write")->required();
  CLI::App* check = app.add_subcommand("check", "load weights against a config");
  check->add_option("--config", config_path, "model config.json")->required();
  check->add_option("--weights", weights_path, "safetensors file")->required();
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvmodel")) return *stop;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(config_path);
  absl::Status status = config.status();
  if (status.ok() && init->parsed()) {
    absl::StatusOr<LayerSchedule> schedule = BuildLayerSchedule(*config);
    status = schedule.ok() ? model::WriteRandomWeights(*config, *schedule, seed, out_path)
                           : schedule.status();
    if (status.ok()) std::cout << "kvmodel: wrote " << out_path << "\n";
  } else if (status.ok()) {
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Load(*config, weights_path);
    status = m.status();
    if (status.ok()) std::cout << "kvmodel: " << weights_path << " matches " << config_path << "\n";
  }
  if (!status.ok()) {
    std::cerr << "kvmodel: error: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) { return kvc::Main(argc, argv); }
