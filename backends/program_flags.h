// The flags the programs that run the engine share (kvgen, kvdemo, kvserve, kvbench's
// engine cases), declared once so their names, choices and help read the same. For
// programs only: it needs CLI11, which the programs' targets carry.
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "engine/model/generate.h"

namespace kvc::model {

// --backend: where the matrix products run. The name is checked by SelectBackends
// (backends/select.h), which knows what this build has.
inline CLI::Option* AddBackendFlag(CLI::App& app, std::string& backend) {
  return app.add_option("--backend", backend, "where the matrix products run: cpu, cuda or cublas")
      ->capture_default_str();
}

// --replay: how a resume from cached pages rebuilds the sliding window — bounded (the
// model's rule: the last window of cached tokens) or exact (bit-identical to a cold
// prefill). kvgen also has "full" (its reference) and checks the value itself.
inline CLI::Option* AddReplayFlag(CLI::App& app, std::string& replay) {
  return app.add_option("--replay", replay, "bounded (the model's rule) or exact")
      ->check(CLI::IsMember({"bounded", "exact"}))
      ->capture_default_str();
}

// --temperature, --top-p, --seed and --greedy: how tokens are chosen (SamplingOptions in
// engine/model/generate.h). The defaults are the caller's: set them in `o` before this.
inline void AddSamplingFlags(CLI::App& app, SamplingOptions& o) {
  app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--top-p", o.top_p, "sample from the most likely tokens holding this share")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "sampling seed (the same seed gives the same tokens)")
      ->capture_default_str();
  app.add_flag_callback(
      "--greedy", [&o] { o.temperature = 0; }, "the most likely token each step (--temperature 0)");
}

}  // namespace kvc::model
