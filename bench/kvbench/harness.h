// The benchmark harness shared by every kvbench case: timed loops (one caller, or N
// concurrent callers), per-call latencies, bytes moved, medians over repetitions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::bench {

struct Sample {
  double seconds = 0;
  uint64_t bytes = 0;
  std::vector<double> lat_us;       // per call
  double p50_us = -1, p99_us = -1;  // set directly by systems that measure themselves (fio)
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
  // Fills p50/p99 from lat_us unless they were set already.
  void Percentiles();
};

// Calls op(iteration) until `seconds` pass; each call moves bytes_per_call.
absl::StatusOr<Sample> Loop(double seconds, uint64_t bytes_per_call,
                            const std::function<absl::Status(uint64_t)>& op);

// `threads` threads each call op(thread, iteration) until `seconds` pass.
absl::StatusOr<Sample> LoopThreads(double seconds, int threads, uint64_t bytes_per_call,
                                   const std::function<absl::Status(int, uint64_t)>& op);

double Median(std::vector<double> v);
// The q-quantile (0 ≤ q ≤ 1) of v by the rule Sample::Percentiles uses; 0 for no values.
double Percentile(std::vector<double> v, double q);

}  // namespace kvc::bench
