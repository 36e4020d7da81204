// Fresh random seeds for tests, always printed so a failure can be replayed:
// KVC_TEST_SEED=<n> fixes the seed.
#pragma once

#include <cstdint>

namespace kvc::testing {

// A seed from KVC_TEST_SEED if set, else from the clock and random_device. Prints
// "[seed] <test name>: <seed>" and records it as a gtest property.
uint64_t FreshSeed();

}  // namespace kvc::testing
