// The MoE experts on the host (MatmulBackend::Experts' default): the products through the
// backend in groups, the gated activation and the sum into each row here.
#include <algorithm>
#include <vector>

#include "base/check.h"
#include "engine/cpu/swiglu.h"
#include "engine/model/matmul.h"

namespace kvc::model {

void CheckExpertJob(const ExpertJob& j, int64_t D, int64_t I) {
  KVC_CHECK(j.rows.size() == j.weights.size() && j.w1->in_features() == D &&
            j.w1->out_features() == I && j.w3->in_features() == D && j.w3->out_features() == I &&
            j.w2->in_features() == I && j.w2->out_features() == D)
      << "an expert job of " << j.rows.size() << " rows and " << j.weights.size()
      << " weights with projections " << j.w1->in_features() << "→" << j.w1->out_features() << ", "
      << j.w3->in_features() << "→" << j.w3->out_features() << ", " << j.w2->in_features() << "→"
      << j.w2->out_features() << " in a block of " << D << "→" << I << "→" << D;
}

void HostExperts(const MatmulBackend& mm, const float* x, int64_t rows,
                 std::span<const ExpertJob> jobs, float limit, float* out) {
  if (jobs.empty()) return;
  const int64_t D = jobs.front().w1->in_features(), I = jobs.front().w1->out_features();
  std::fill(out, out + rows * D, 0.0f);
  struct Scratch {
    std::vector<float> xs, g, up, y;
  };
  // A job's rows: all of them (the shared expert) or the routed ones, gathered.
  auto count = [&](const ExpertJob& j) {
    return j.rows.empty() ? rows : static_cast<int64_t>(j.rows.size());
  };
  auto run_group = [&](std::span<const ExpertJob> group) {
    std::vector<Scratch> s(group.size());
    std::vector<GemmCall> calls;
    for (size_t q = 0; q < group.size(); ++q) {
      const ExpertJob& j = group[q];
      CheckExpertJob(j, D, I);
      const int64_t n = count(j);
      const float* xs = x;
      if (!j.rows.empty()) {
        s[q].xs.resize(static_cast<size_t>(n * D));
        for (int64_t m = 0; m < n; ++m)
          std::copy(x + j.rows[m] * D, x + (j.rows[m] + 1) * D, s[q].xs.begin() + m * D);
        xs = s[q].xs.data();
      }
      s[q].g.resize(static_cast<size_t>(n * I));
      s[q].up.resize(static_cast<size_t>(n * I));
      calls.push_back({xs, n, j.w1, s[q].g.data()});
      calls.push_back({xs, n, j.w3, s[q].up.data()});
    }
    mm.GemmGroup(calls);
    calls.clear();
    for (size_t q = 0; q < group.size(); ++q) {
      const ExpertJob& j = group[q];
      const int64_t n = count(j);
      for (int64_t r = 0; r < n; ++r) {
        const float weight = j.rows.empty() ? 1.0f : j.weights[r];
        for (int64_t i = 0; i < I; ++i)
          s[q].g[r * I + i] = cpu::SwiGlu(s[q].g[r * I + i], s[q].up[r * I + i], limit, weight);
      }
      s[q].y.resize(static_cast<size_t>(n * D));
      calls.push_back({s[q].g.data(), n, j.w2, s[q].y.data()});
    }
    mm.GemmGroup(calls);
    for (size_t q = 0; q < group.size(); ++q) {  // in job order
      const ExpertJob& j = group[q];
      const std::vector<float>& y = s[q].y;
      if (j.rows.empty()) {
        for (int64_t i = 0; i < rows * D; ++i) out[i] += y[i];
      } else {
        for (size_t m = 0; m < j.rows.size(); ++m)
          for (int64_t i = 0; i < D; ++i) out[j.rows[m] * D + i] += y[m * D + i];
      }
    }
  };
  for (size_t first = 0; first < jobs.size();) {
    size_t last = first;
    int64_t n = 0;
    do {
      n += count(jobs[last]);
      ++last;
    } while (last < jobs.size() && n < kExpertGroupRows);
    run_group(jobs.subspan(first, last - first));
    first = last;
  }
}

}  // namespace kvc::model
