#include "bench/kvbench/harness.h"
#include "base/status_macros.h"

#include <thread>

namespace kvc::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double Micros(SteadyClock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

}  // namespace

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

void Sample::Percentiles() {
  if (p50_us >= 0 || lat_us.empty()) return;
  p50_us = Percentile(lat_us, 0.5);
  p99_us = Percentile(lat_us, 0.99);
}

absl::StatusOr<Sample> Loop(double seconds, uint64_t bytes_per_call,
                            const std::function<absl::Status(uint64_t)>& op) {
  Sample s;
  const auto start = SteadyClock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  for (uint64_t i = 0;; ++i) {
    const auto t0 = SteadyClock::now();
    if (t0 >= end) break;
    KVC_RETURN_IF_ERROR(op(i));
    s.lat_us.push_back(Micros(SteadyClock::now() - t0));
    s.bytes += bytes_per_call;
  }
  s.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return s;
}

absl::StatusOr<Sample> LoopThreads(double seconds, int threads, uint64_t bytes_per_call,
                                   const std::function<absl::Status(int, uint64_t)>& op) {
  std::vector<Sample> per(threads);
  std::vector<absl::Status> status(threads);
  std::vector<std::thread> pool;
  const auto start = SteadyClock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      absl::StatusOr<Sample> s =
          Loop(seconds, bytes_per_call, [&](uint64_t i) { return op(t, i); });
      if (s.ok()) {
        per[t] = *std::move(s);
      } else {
        status[t] = s.status();
      }
    });
  }
  for (auto& th : pool) th.join();
  Sample total;
  total.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  for (int t = 0; t < threads; ++t) {
    if (!status[t].ok()) return status[t];
    total.bytes += per[t].bytes;
    total.lat_us.insert(total.lat_us.end(), per[t].lat_us.begin(), per[t].lat_us.end());
  }
  return total;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace kvc::bench
