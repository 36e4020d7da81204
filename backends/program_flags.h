// The flags the programs that run the engine share (kvgen, kvdemo, kvserve, kvbench's
// engine cases), declared once so their names, choices and help read the same. For
// programs only: it needs CLI11, which the programs' targets carry.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

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

}  // namespace kvc::model
