#include "bench/kvbench/bootstrap.h"

#include <algorithm>
#include <random>

#include "bench/kvbench/harness.h"

namespace kvc::bench {

Interval ClusterBootstrap(size_t clusters,
                          const std::function<double(std::span<const double>)>& stat, int resamples,
                          uint64_t seed, double level) {
  if (clusters == 0 || resamples <= 0) return {};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, clusters - 1);
  std::vector<double> weights(clusters), results;
  results.reserve(static_cast<size_t>(resamples));
  for (int r = 0; r < resamples; ++r) {
    std::fill(weights.begin(), weights.end(), 0.0);
    for (size_t i = 0; i < clusters; ++i) weights[pick(rng)] += 1;
    results.push_back(stat(weights));
  }
  const double tail = (1 - level) / 2;
  return {Percentile(results, tail), Percentile(results, 1 - tail)};
}

double ClusterWeightedMean(std::span<const double> values, std::span<const int> cluster_of,
                           std::span<const double> weights) {
  double sum = 0, count = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double w = weights[static_cast<size_t>(cluster_of[i])];
    sum += w * values[i];
    count += w;
  }
  return count > 0 ? sum / count : 0.0;
}

}  // namespace kvc::bench
