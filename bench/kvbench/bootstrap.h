// Percentile-bootstrap confidence intervals over clusters (kvbench quality's documents):
// resample whole clusters with replacement, recompute the statistic, take the middle
// `level` of the results. Resampling documents rather than single resume points keeps the
// points of one document — which share its text and so err together — together, so the
// interval is not narrower than the data allow.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kvc::bench {

struct Interval {
  double lo = 0, hi = 0;
  bool Contains(double x) const { return lo <= x && x <= hi; }
};

// `stat(weights)` computes the statistic with cluster c counted weights[c] times (the
// observed data: every weight 1). `resamples` draws from a generator seeded by `seed`, so
// an interval is reproducible; level in (0, 1).
Interval ClusterBootstrap(size_t clusters,
                          const std::function<double(std::span<const double>)>& stat, int resamples,
                          uint64_t seed, double level = 0.95);

// A weighted mean of per-item values, item i in cluster cluster_of[i]: the statistic most
// figures use (mean KL, agreement, Δloss, shares).
double ClusterWeightedMean(std::span<const double> values, std::span<const int> cluster_of,
                           std::span<const double> weights);

}  // namespace kvc::bench
