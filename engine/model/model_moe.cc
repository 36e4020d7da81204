// MoE: routing and the grouped experts, with the shared expert.
#include "engine/model/model_impl.h"

namespace kvc::model {

void ModelImpl::Moe(int64_t l, const std::vector<float>& x, int64_t rows, std::vector<float>& out,
                    std::span<const GemmCall> also) const {
  const LayerWeights& w = layers[l];
  const int64_t E_ = static_cast<int64_t>(w.experts.size()), k = w.experts_per_token,
                I = c.moe_intermediate_size;
  const float limit = static_cast<float>(c.swiglu_limit);
  std::vector<float> logits(rows * w.gate.out_features());
  std::vector<GemmCall> gate = {{x.data(), rows, &w.gate, logits.data()}};
  AppendToGroup(gate, also);
  mm->GemmGroup(gate);
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(E_);  // (row, weight)
  for (int64_t r = 0; r < rows; ++r) {
    for (const auto& [e, weight] : RouteToken(Row(logits, r, E_), w.gate_bias, k, c.norm_topk_prob,
                                              static_cast<float>(c.routed_scaling_factor))) {
      by_expert[e].push_back({r, weight});
    }
  }
  // The routed experts that got rows, in id order, then the shared one over every row.
  // Their products go to the backend in groups (gate and up projections, then the down
  // projections) so a device backend launches a group's experts together; groups hold at
  // most kGroupRows rows to bound the intermediates. Results do not depend on grouping.
  struct Job {
    const ExpertWeights* ew = nullptr;
    std::vector<int64_t> rows;  // empty: every row (the shared expert)
    std::vector<float> xs, weights, g, up, y;
  };
  std::vector<Job> jobs;
  for (int64_t e = 0; e < E_; ++e) {
    const auto& members = by_expert[e];
    if (members.empty()) continue;
    Job& j = jobs.emplace_back();
    j.ew = &w.experts[e];
    const int64_t n = static_cast<int64_t>(members.size());
    j.xs.resize(n * D);
    for (int64_t m = 0; m < n; ++m) {
      j.rows.push_back(members[m].first);
      j.weights.push_back(members[m].second);
      std::copy(x.begin() + members[m].first * D, x.begin() + (members[m].first + 1) * D,
                j.xs.begin() + m * D);
    }
  }
  out.assign(rows * D, 0.0f);
  constexpr int64_t kGroupRows = 8192;
  auto run_group = [&](std::span<Job> group) {
    std::vector<GemmCall> calls;
    for (Job& j : group) {
      const int64_t n = j.rows.empty() ? rows : static_cast<int64_t>(j.rows.size());
      const float* xs = j.rows.empty() ? x.data() : j.xs.data();
      j.g.resize(n * I);
      j.up.resize(n * I);
      calls.push_back({xs, n, &j.ew->w1, j.g.data()});
      calls.push_back({xs, n, &j.ew->w3, j.up.data()});
    }
    mm->GemmGroup(calls);
    calls.clear();
    for (Job& j : group) {
      const int64_t n = j.rows.empty() ? rows : static_cast<int64_t>(j.rows.size());
      for (int64_t r = 0; r < n; ++r) {
        const float weight = j.rows.empty() ? 1.0f : j.weights[r];
        for (int64_t i = 0; i < I; ++i) {
          const float gi = std::min(j.g[r * I + i], limit);
          const float ui = std::clamp(j.up[r * I + i], -limit, limit);
          j.g[r * I + i] = weight * cpu::Silu(gi) * ui;
        }
      }
      j.y.resize(n * D);
      calls.push_back({j.g.data(), n, &j.ew->w2, j.y.data()});
    }
    mm->GemmGroup(calls);
    for (Job& j : group) {  // in job order: routed experts by id, the shared one last
      if (j.rows.empty()) {
        for (int64_t i = 0; i < rows * D; ++i) out[i] += j.y[i];
      } else {
        for (size_t m = 0; m < j.rows.size(); ++m) {
          for (int64_t i = 0; i < D; ++i) out[j.rows[m] * D + i] += j.y[m * D + i];
        }
      }
      j = Job();  // free its intermediates
    }
  };
  Job& shared = jobs.emplace_back();
  shared.ew = &w.shared;
  for (size_t first = 0; first < jobs.size();) {
    size_t last = first;
    int64_t n = 0;
    do {
      n += jobs[last].rows.empty() ? rows : static_cast<int64_t>(jobs[last].rows.size());
      ++last;
    } while (last < jobs.size() && n < kGroupRows);
    run_group(std::span(jobs).subspan(first, last - first));
    first = last;
  }
}

}  // namespace kvc::model
