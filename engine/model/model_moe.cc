// MoE: routing, then the routed experts and the shared one (MatmulBackend::Experts).
#include "engine/model/model_impl.h"

namespace kvc::model {

MoeBlock ModelImpl::MoeBlockOf(int64_t l) const {
  const LayerWeights& w = layers[l];
  const int64_t E_ = static_cast<int64_t>(w.experts.size());
  MoeBlock block{&w.gate,
                 w.gate_bias,
                 {},
                 {},
                 {},
                 w.experts_per_token,
                 config.norm_topk_prob,
                 static_cast<float>(config.routed_scaling_factor),
                 static_cast<float>(config.swiglu_limit)};
  for (int64_t e = 0; e <= E_; ++e) {
    const ExpertWeights& ew = e < E_ ? w.experts[e] : w.shared;
    block.w1.push_back(&ew.w1);
    block.w3.push_back(&ew.w3);
    block.w2.push_back(&ew.w2);
  }
  return block;
}

void ModelImpl::Moe(int64_t l, const std::vector<float>& x, int64_t rows, std::vector<float>& out,
                    std::span<const GemmCall> also) const {
  const LayerWeights& w = layers[l];
  const int64_t E_ = static_cast<int64_t>(w.experts.size()), k = w.experts_per_token;
  out.resize(rows * dim);
  // A device backend may route where the gate's logits are: no round trip in between.
  const MoeBlock block = MoeBlockOf(l);
  if (mm->RoutedMoe(x.data(), rows, block, also, out.data())) return;
  std::vector<float> logits(rows * w.gate.out_features());
  std::vector<GemmCall> gate = {{x.data(), rows, &w.gate, logits.data()}};
  AppendToGroup(gate, also);
  mm->GemmGroup(gate);
  // The routed experts that got rows, in id order, then the shared one over every row:
  // the order their outputs are summed in.
  std::vector<ExpertJob> jobs(E_);
  for (int64_t r = 0; r < rows; ++r) {
    for (const auto& [e, weight] :
         RouteToken(Row(logits, r, E_), w.gate_bias, k, config.norm_topk_prob,
                    static_cast<float>(config.routed_scaling_factor))) {
      jobs[e].rows.push_back(r);
      jobs[e].weights.push_back(weight);
    }
  }
  for (int64_t e = 0; e < E_; ++e) {
    jobs[e].w1 = &w.experts[e].w1;
    jobs[e].w3 = &w.experts[e].w3;
    jobs[e].w2 = &w.experts[e].w2;
  }
  std::erase_if(jobs, [](const ExpertJob& j) { return j.rows.empty(); });
  jobs.push_back({&w.shared.w1, &w.shared.w3, &w.shared.w2, {}, {}});
  mm->Experts(x.data(), rows, jobs, static_cast<float>(config.swiglu_limit), out.data());
}

}  // namespace kvc::model
