#include "engine/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "engine/cpu/hyper_connections.h"

namespace kvc::cpu {

void RmsNorm(const float* x, const float* w, int64_t n, double eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

std::vector<double> RopeFrequencies(int64_t rope_dim, double base, int64_t original_seq_len,
                                    double factor, double beta_fast, double beta_slow) {
  const int64_t half = rope_dim / 2;
  std::vector<double> f(half);
  for (int64_t i = 0; i < half; ++i) {
    f[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
  }
  if (original_seq_len > 0) {
    auto corr = [&](double r) {
      return static_cast<double>(rope_dim) *
             std::log(static_cast<double>(original_seq_len) / (2.0 * std::numbers::pi * r)) /
             (2.0 * std::log(base));
    };
    const double low = std::max(std::floor(corr(beta_fast)), 0.0);
    const double high = std::min(std::ceil(corr(beta_slow)), static_cast<double>(rope_dim - 1));
    for (int64_t i = 0; i < half; ++i) {
      const double ramp =
          std::clamp((static_cast<double>(i) - low) / std::max(high - low, 1e-3), 0.0, 1.0);
      f[i] = f[i] / factor * ramp + f[i] * (1.0 - ramp);
    }
  }
  return f;
}

RopeTurn RopeTurnAt(double freq, int64_t pos, bool inverse) {
  const double angle = static_cast<double>(pos) * freq * (inverse ? -1.0 : 1.0);
  return {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
}

std::vector<float> RopeTurns(std::span<const double> freqs, std::span<const int64_t> positions,
                             bool inverse) {
  const size_t half = freqs.size();
  std::vector<float> turns(positions.size() * half * 2);
  for (size_t r = 0; r < positions.size(); ++r) {
    for (size_t i = 0; i < half; ++i) {
      const RopeTurn t = RopeTurnAt(freqs[i], positions[r], inverse);
      turns[(r * half + i) * 2] = t.cos;
      turns[(r * half + i) * 2 + 1] = t.sin;
    }
  }
  return turns;
}

void ApplyRope(float* x, int64_t dim, const std::vector<double>& freqs, int64_t pos, bool inverse) {
  const int64_t rd = static_cast<int64_t>(freqs.size()) * 2;
  float* t = x + dim - rd;
  for (size_t i = 0; i < freqs.size(); ++i) {
    const auto [c, s] = RopeTurnAt(freqs[i], pos, inverse);
    const float a = t[2 * i], b = t[2 * i + 1];
    t[2 * i] = a * c - b * s;
    t[2 * i + 1] = a * s + b * c;
  }
}

HcCoefficients HcFromMixes(std::span<const float> m, std::span<const float> base,
                           std::span<const float> scale, int64_t hc, int64_t iters, double eps) {
  HcCoefficients c;
  c.pre.resize(hc);
  c.post.resize(hc);
  c.comb.resize(hc * hc);
  HcCoefficientsOf(m.data(), base.data(), scale.data(), hc, iters, static_cast<float>(eps),
                   c.pre.data(), c.post.data(), c.comb.data());
  return c;
}

void HcPre(const float* X, const float* a, int64_t hc, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) out[i] = HcPreAt(X, a, hc, d, i);
}

void HcPost(const float* f, const float* R, const HcCoefficients& c, int64_t hc, int64_t d,
            float* out) {
  for (int64_t k = 0; k < hc; ++k) {
    for (int64_t i = 0; i < d; ++i)
      out[k * d + i] = HcPostAt(f, R, c.post.data(), c.comb.data(), hc, d, k, i);
  }
}

std::vector<int32_t> TopKAscending(std::span<const float> scores, int64_t k) {
  // One scan keeping the k best so far in a heap whose top is the worst of them; "better" is
  // the higher score, then the lower index. The scan runs in index order, so a later index
  // with a score equal to the worst kept never displaces it: only a strictly higher score
  // enters. A heap, not a sorted array: trained indexers score recent positions higher, so
  // most positions enter and a sorted insert would shift k entries each time.
  using Entry = std::pair<float, int32_t>;
  const auto better = [](const Entry& a, const Entry& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::vector<Entry> heap;
  if (k <= 0) return {};
  heap.reserve(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(scores.size()))));
  for (size_t i = 0; i < scores.size(); ++i) {
    const float v = scores[i];
    if (v == -std::numeric_limits<float>::infinity()) continue;
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.emplace_back(v, static_cast<int32_t>(i));
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (v > heap.front().first) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = {v, static_cast<int32_t>(i)};
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::vector<int32_t> idx;
  idx.reserve(heap.size());
  for (const auto& [v, i] : heap) idx.push_back(i);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace kvc::cpu
