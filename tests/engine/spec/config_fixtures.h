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

}  // namespace kvc::testing
