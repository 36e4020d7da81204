// Shared helpers for tests that load, mutate and re-parse the checked-in model configs.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "engine/spec/model_config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvc::testing {

inline std::string ConfigPath(const std::string& name) {
  return std::string(KVC_SOURCE_DIR) + "/configs/" + name;
}
inline std::string kReferenceConfig() { return ConfigPath("deepseek-v4.1-flash.config.json"); }
inline std::string kMiniConfig() { return ConfigPath("mini.json"); }

inline nlohmann::json LoadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

// Parses a (possibly mutated) JSON config; fails the test if it does not parse.
inline ModelConfig ParseOrDie(const nlohmann::json& j) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump(), "test");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

// Bytes per token written the way the architecture describes it, straight from the JSON:
// each Full (kv source) layer stores one main entry and one index entry per compressed
// position. Reindex layers are deliberately absent: they borrow the nearest Full layer's
// index K.
inline double PaperFormula(const nlohmann::json& t) {
  const double head = t["head_dim"].get<double>(), index = t["index_head_dim"].get<double>();
  const double entry = head / 2 + head / 16 + index / 2 + index / 32;
  double total = 0;
  for (int64_t layer : t["kv_source_layer_ids"])
    total += entry / t["compress_ratios"][layer].get<double>();
  return total;
}

// Per token, one FP8 (E4M3 + a power-of-two scale per 32) SWA row of head_dim per layer.
inline double SwaRowBytes(const nlohmann::json& t) {
  const double head = t["head_dim"].get<double>();
  return head + head / 32;
}

}  // namespace kvc::testing
