#include "tests/testing/seed.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace kvc::testing {

uint64_t FreshSeed() {
  uint64_t seed;
  if (const char* env = std::getenv("KVC_TEST_SEED"); env != nullptr && *env != '\0') {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[seed] %s.%s: KVC_TEST_SEED=%llu\n", info ? info->test_suite_name() : "?",
              info ? info->name() : "?", static_cast<unsigned long long>(seed));
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

}  // namespace kvc::testing
