// The compressor: pooling window KV into global-KV entries, quantized into the pages.
#include "engine/model/model_impl.h"

namespace kvc::model {

void ModelImpl::EmitEntries(SequenceState& s, int64_t l, std::vector<float> latents,
                            std::vector<float> keys) const {
  const int64_t n = static_cast<int64_t>(latents.size()) / head_dim;
  if (n == 0) return;
  const AttentionWeights& a = layers[l].attn;
  const int64_t Id = config.index_head_dim;
  if (keys.empty()) keys = Linear(latents, n, a.i_wk);  // from the RoPE-free latents
  KVC_CHECK(static_cast<int64_t>(keys.size()) == n * Id)
      << "layer " << l << ": keys for " << keys.size() / Id << " of " << n;
  for (int64_t e = 0; e < n; ++e)
    EmitEntry(s, l, std::span<float>(latents.data() + e * head_dim, head_dim),
              std::span<float>(keys.data() + e * Id, Id));
}

void ModelImpl::EmitEntry(SequenceState& s, int64_t l, std::span<float> latent,
                          std::span<float> k) const {
  LayerState& ls = s.layers[l];
  const AttentionWeights& a = layers[l].attn;
  const int64_t ratio = sched.layers[l].compress_ratio, Id = config.index_head_dim;
  const int64_t j = ls.entries;
  const int64_t pos = j * ratio;
  // The index key normalized and rotated, the latent rotated; both quantized straight into
  // the page (the float copies are their dequantized values).
  cpu::RmsNorm(k.data(), a.i_k_norm.data(), Id, config.rms_norm_eps, k.data());
  cpu::ApplyRope(k.data(), Id, freqs[l], pos);
  cpu::ApplyRope(latent.data(), head_dim, freqs[l], pos);
  const int64_t chunk = pos / layout.chunk_tokens;
  std::vector<uint8_t>& page = s.WritePage(chunk, layout.chunk_bytes);
  const int64_t local = j - chunk * (layout.chunk_tokens / ratio);
  const ChunkSection& mc = layout.Section(l, SectionKind::kMainCodes);
  const ChunkSection& ms = layout.Section(l, SectionKind::kMainScales);
  const ChunkSection& ic = layout.Section(l, SectionKind::kIndexCodes);
  const ChunkSection& is = layout.Section(l, SectionKind::kIndexScales);
  const int64_t mcb = CodesBytes(KvFormat::kMainKv, head_dim),
                msb = ScalesBytes(KvFormat::kMainKv, head_dim);
  const int64_t icb = CodesBytes(KvFormat::kIndexK, Id), isb = ScalesBytes(KvFormat::kIndexK, Id);
  std::span<uint8_t> pg(page);
  Quantize(KvFormat::kMainKv, latent, pg.subspan(mc.offset + local * mcb, mcb),
           pg.subspan(ms.offset + local * msb, msb));
  Quantize(KvFormat::kIndexK, k, pg.subspan(ic.offset + local * icb, icb),
           pg.subspan(is.offset + local * isb, isb));
  ls.main_f.resize((j + 1) * head_dim);
  ls.index_f.resize((j + 1) * Id);
  Dequantize(KvFormat::kMainKv, pg.subspan(mc.offset + local * mcb, mcb),
             pg.subspan(ms.offset + local * msb, msb),
             std::span<float>(ls.main_f.data() + j * head_dim, head_dim));
  Dequantize(KvFormat::kIndexK, pg.subspan(ic.offset + local * icb, icb),
             pg.subspan(is.offset + local * isb, isb),
             std::span<float>(ls.index_f.data() + j * Id, Id));
  ++ls.entries;
}

int64_t ModelImpl::EntriesCompleted(const SequenceState& s, int64_t l, int64_t a, int64_t b) const {
  const LayerState& ls = s.layers[l];
  const int64_t ratio = sched.layers[l].compress_ratio;
  const int64_t done = ls.entries * ratio + ls.pend_rows;  // positions already consumed
  return (ls.pend_rows + std::max<int64_t>(0, b - std::max(a, done))) / ratio;
}

bool ModelImpl::WriteEntriesWhereTheyAre(SequenceState& s, int64_t l,
                                         const CompressorInput& in) const {
  LayerState& ls = s.layers[l];
  const int64_t ratio = sched.layers[l].compress_ratio, Id = config.index_head_dim;
  const int64_t n = static_cast<int64_t>(in.keys.size()) / Id, j0 = ls.entries;
  if (n == 0) return true;
  const int64_t per_page = layout.chunk_tokens / ratio;
  const int64_t first_page = j0 / per_page, last_page = (j0 + n - 1) / per_page;
  std::vector<uint64_t> claimed_from;
  for (int64_t p = first_page; p <= last_page; ++p) {
    claimed_from.push_back(p < static_cast<int64_t>(s.pages.size()) ? s.page_versions[p] : 0);
    s.WritePage(p, layout.chunk_bytes);
  }
  ls.main_f.resize((j0 + n) * head_dim);
  ls.index_f.resize((j0 + n) * Id);
  EntryBatch b;
  b.first = j0;
  b.count = n;
  b.ratio = ratio;
  b.dim = head_dim;
  b.index_dim = Id;
  b.latents = in.latents.data();
  b.keys = in.keys.data();
  b.key_norm = layers[l].attn.i_k_norm;
  b.eps = config.rms_norm_eps;
  b.rope_freqs = &freqs[l];
  b.pages = s.pages;
  b.page_versions = s.page_versions;
  b.claimed_from = claimed_from;
  b.sequence = s.id;
  b.layout = &layout;
  b.layer = l;
  b.main_out = ls.main_f.data() + j0 * head_dim;
  b.index_out = ls.index_f.data() + j0 * Id;
  b.landing = mm.get();
  if (!attn->WriteEntries(b)) return false;  // (the pages claimed again by the host's writes)
  ls.entries += n;
  return true;
}

void ModelImpl::CompressorCalls(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                                const std::vector<float>& x, CompressorInput& in,
                                std::vector<GemmCall>& calls, bool landing) const {
  const LayerState& ls = s.layers[l];
  const AttentionWeights& w = layers[l].attn;
  const int64_t ratio = sched.layers[l].compress_ratio;
  const int64_t done = ls.entries * ratio + ls.pend_rows;  // positions already consumed
  in.first = std::max(a, done);
  in.rows = std::max<int64_t>(0, b - in.first);
  if (in.rows == 0) return;
  KVC_CHECK(in.first == done) << "layer " << l << ": compressor gap at " << done;
  const float* xs = x.data() + (in.first - a) * dim;
  in.kv.resize(in.rows * w.c_wkv.out_features());
  const int64_t kv_call = static_cast<int64_t>(calls.size());
  calls.push_back({xs, in.rows, &w.c_wkv, in.kv.data()});
  in.landing = landing;
  if (ratio == 1) {  // each row an entry: its latent is the row normalized
    in.keys.resize(in.rows * w.i_wk.out_features());
    calls.push_back(
        {nullptr, in.rows, &w.i_wk, in.keys.data(), kv_call, w.c_norm.data(), config.rms_norm_eps});
    if (landing) {
      in.latents.resize(in.rows * head_dim);
      calls.back().input_out = in.latents.data();
    }
  }
  if (ratio > 1) {
    in.score.resize(in.rows * w.c_wgate.out_features());
    const int64_t score_call = static_cast<int64_t>(calls.size());
    calls.push_back({xs, in.rows, &w.c_wgate, in.score.data()});
    // The entries this pass completes: their index keys from their latents (pooled and
    // normalized as Compress will pool them), in the same group.
    if (const int64_t entries = EntriesCompleted(s, l, a, b); entries > 0) {
      in.keys.resize(entries * w.i_wk.out_features());
      GemmCall keys{
          nullptr, entries, &w.i_wk, in.keys.data(), kv_call, w.c_norm.data(), config.rms_norm_eps};
      keys.pool_ratio = ratio;
      keys.pool_pending = ls.pend_rows;
      keys.score_of = score_call;
      keys.pool_kv = ls.pend_kv.data();
      keys.pool_score = ls.pend_score.data();
      if (landing) {
        in.latents.resize(entries * head_dim);
        keys.input_out = in.latents.data();
      }
      calls.push_back(keys);
    }
  }
}

void ModelImpl::Compress(SequenceState& s, int64_t l, int64_t a, int64_t b,
                         const std::vector<float>& x) const {
  CompressorInput in;
  std::vector<GemmCall> calls;
  CompressorCalls(s, l, a, b, x, in, calls);
  mm->GemmGroup(calls);
  Compress(s, l, in);
}

void ModelImpl::Compress(SequenceState& s, int64_t l, CompressorInput& in) const {
  LayerState& ls = s.layers[l];
  const AttentionWeights& w = layers[l].attn;
  const int64_t ratio = sched.layers[l].compress_ratio, rows = in.rows;
  const std::vector<float>&kv = in.kv, &score = in.score;
  // Rows [from, rows) join the pending group where they land (after the group's pooled
  // rows, which the keys product took with it, are dropped).
  auto join_pending = [&](int64_t from, bool after_pooling) {
    for (auto [in_rows, to] : {std::pair{&kv, &ls.pend_kv}, std::pair{&score, &ls.pend_score}}) {
      if (after_pooling) to->clear();
      const size_t old = to->size();
      to->resize(old + (rows - from) * head_dim);
      mm->CopyWhenLanded(in_rows->data() + from * head_dim, (rows - from) * head_dim,
                         to->data() + old);
    }
    ls.pend_rows = (after_pooling ? 0 : ls.pend_rows) + rows - from;
  };
  if (ratio > 1 && ls.pend_rows + rows < ratio) {
    join_pending(0, false);
    return;
  }
  if (in.landing) {
    const int64_t Id = config.index_head_dim, n = static_cast<int64_t>(in.keys.size()) / Id;
    if (ratio > 1) join_pending(n * ratio - ls.pend_rows, true);
    if (WriteEntriesWhereTheyAre(s, l, in)) return;
    mm->Settle();  // the host writes them: the latents and keys land first
    EmitEntries(s, l, in.latents, in.keys);
    return;
  }
  std::vector<float> latents;  // the pass's new entries, emitted together
  for (int64_t r = 0; r < rows; ++r) {
    if (ratio == 1) {
      latents.insert(latents.end(), kv.begin() + r * head_dim, kv.begin() + (r + 1) * head_dim);
      float* latent = latents.data() + latents.size() - head_dim;
      cpu::RmsNorm(latent, w.c_norm.data(), head_dim, config.rms_norm_eps,
                   latent);  // as the keys' input
      continue;
    }
    ls.pend_kv.insert(ls.pend_kv.end(), kv.begin() + r * head_dim, kv.begin() + (r + 1) * head_dim);
    ls.pend_score.insert(ls.pend_score.end(), score.begin() + r * head_dim,
                         score.begin() + (r + 1) * head_dim);
    if (++ls.pend_rows < ratio) continue;
    // Softmax over the group's tokens per channel, then the weighted sum.
    std::vector<float> latent = PoolGroup(ls.pend_kv.data(), ls.pend_score.data(), ratio, head_dim);
    cpu::RmsNorm(latent.data(), w.c_norm.data(), head_dim, config.rms_norm_eps, latent.data());
    ls.pend_kv.clear();
    ls.pend_score.clear();
    ls.pend_rows = 0;
    latents.insert(latents.end(), latent.begin(), latent.end());
  }
  EmitEntries(s, l, std::move(latents), in.keys);
}

}  // namespace kvc::model
