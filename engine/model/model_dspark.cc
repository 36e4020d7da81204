// DSpark: the drafter's attention, its rings, and Model::Draft.
#include "base/status_macros.h"
#include "engine/model/model_impl.h"

namespace kvc::model {

void ModelImpl::DraftAttention(SequenceState& s, int64_t l, int64_t a, int64_t b,
                               const std::vector<float>& x, std::vector<float>& out,
                               std::span<const GemmCall> also) const {
  const LayerState& ls = s.layers[l];
  const int64_t rows = b - a;
  std::vector<float> q, kv;  // kv: the draft block's own rows, never stored
  QueriesAndWindowKv(l, a, rows, x, q, kv, nullptr, nullptr, also);
  // Every draft query sees the main model's window (accepted positions, from the ring, in
  // position order) and the whole draft block: attention inside the block is bidirectional.
  std::vector<int32_t> shared;
  for (int64_t p = std::max<int64_t>(0, a - window); p < a; ++p) {
    if (ls.ring_pos[p % window] == p) shared.push_back(static_cast<int32_t>(p % window));
  }
  for (int64_t r = 0; r < rows; ++r) shared.push_back(static_cast<int32_t>(window + r));
  std::vector<int32_t> offsets = {0}, entries;
  for (int64_t r = 0; r < rows; ++r) {
    entries.insert(entries.end(), shared.begin(), shared.end());
    offsets.push_back(static_cast<int32_t>(entries.size()));
  }
  AttentionBatch batch;
  batch.window = ls.ring;
  batch.fresh = kv.data();
  batch.fresh_rows = rows;
  batch.offsets = offsets;
  batch.entries = entries;
  AttendAndProject(l, a, rows, q, batch, out);
}

void ModelImpl::DraftRingCalls(int64_t a, int64_t b, const std::vector<float>& main_hidden,
                               DraftRingProducts& p, std::vector<GemmCall>& calls) const {
  if (draft_layers == 0) return;
  p.first = std::max(a, b - window);
  p.rows = b - p.first;
  const int64_t width = static_cast<int64_t>(targets.size()) * dim;
  p.mh.assign(main_hidden.begin() + (p.first - a) * width, main_hidden.end());
  p.mx.resize(p.rows * draft.main_proj.out_features());
  // Each draft layer's window KV from the projection RMS-normalized: chained on it.
  const int64_t proj = static_cast<int64_t>(calls.size());
  calls.push_back({p.mh.data(), p.rows, &draft.main_proj, p.mx.data()});
  p.kv.assign(draft_layers, {});
  p.finish.clear();
  for (int64_t l = n_layers; l < n_layers + draft_layers; ++l)
    p.finish.push_back(WindowRowFinish(l, p.first));
  for (int64_t l = n_layers; l < n_layers + draft_layers; ++l) {
    const PackedMatrix& wkv = layers[l].attn.wkv;
    p.kv[l - n_layers].resize(p.rows * wkv.out_features());
    calls.push_back({nullptr, p.rows, &wkv, p.kv[l - n_layers].data(), proj, draft.main_norm.data(),
                     config.rms_norm_eps});
    calls.back().finish = &p.finish[l - n_layers];
  }
}

void ModelImpl::WriteDraftRings(SequenceState& s, const DraftRingProducts& p) const {
  for (int64_t l = n_layers; l < n_layers + draft_layers; ++l) {
    LayerState& ls = s.layers[l];
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t pos = p.first + r;
      const float* k = &p.kv[l - n_layers][r * head_dim];
      std::copy(k, k + head_dim, ls.ring.begin() + (pos % window) * head_dim);
      ls.ring_pos[pos % window] = pos;
    }
  }
}

absl::StatusOr<std::vector<uint32_t>> Model::Draft(Sequence& seq, uint32_t next) const {
  const ModelImpl& m = *impl_;
  SequenceState& s = *seq.s_;
  if (m.draft_layers == 0)
    return absl::FailedPreconditionError("the config has no DSpark draft layers");
  if (s.tokens.empty()) return absl::FailedPreconditionError("Draft needs a prefilled sequence");
  KVC_RETURN_IF_ERROR(m.CheckTokens(std::span(&next, 1)));
  const int64_t B = m.config.dspark_block_size, a = static_cast<int64_t>(s.tokens.size());
  // The block: the next token, then noise placeholders, at the positions after it.
  std::vector<float> X(B * m.hc_mult * m.dim), pre(B * m.hc_mult, 0.0f);
  for (int64_t r = 0; r < B; ++r) {
    const uint32_t id = r == 0 ? next : static_cast<uint32_t>(m.config.dspark_noise_token_id);
    const float* e = m.embed.data() + static_cast<int64_t>(id) * m.dim;
    for (int64_t k = 0; k < m.hc_mult; ++k)
      std::copy(e, e + m.dim, X.data() + (r * m.hc_mult + k) * m.dim);
    pre[r * m.hc_mult] = 1.0f;
  }
  m.RunLayers(s, m.n_layers, m.n_layers + m.draft_layers, a, a + B, X, pre, /*compress=*/false);
  // Row i proposes the token after position a + i, with the Markov head's bigram bias from
  // the token before it (the real next token for row 0, then the drafts).
  std::vector<uint32_t> drafts;
  uint32_t prev = next;
  const int64_t rank = m.config.dspark_markov_rank;
  std::vector<float> bias(m.config.vocab_size);
  for (int64_t r = 0; r < B; ++r) {
    std::vector<float> logits = m.Logits(X, pre, r, &m.draft.norm);
    m.mm->Gemm(m.draft.markov_embed.data() + static_cast<int64_t>(prev) * rank, 1,
               m.draft.markov_head, bias.data());
    for (int64_t v = 0; v < m.config.vocab_size; ++v) logits[v] += bias[v];
    prev = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    drafts.push_back(prev);
  }
  return drafts;
}

}  // namespace kvc::model
