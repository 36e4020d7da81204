// Attention: queries and the FP8 window, sparse attention over the window and FP4 pages.
#include "engine/model/model_impl.h"

namespace kvc::model {

void ModelImpl::QueriesAndWindowKv(int64_t l, int64_t a, int64_t rows, const std::vector<float>& x,
                                   std::vector<float>& q, std::vector<float>& kv,
                                   std::vector<float>* qi, std::vector<float>* wts,
                                   std::span<const GemmCall> also,
                                   std::vector<std::vector<float>>* landing) const {
  const AttentionWeights& w = layers[l].attn;
  // qr (rows × q_lora_rank), kv (rows × hd), then from qr RMS-normalized: q (rows × H ×
  // hd) and the indexer's qi (rows × IH × Id); wts from x.
  std::vector<float> qr(rows * w.wq_a.out_features());
  kv.resize(rows * w.wkv.out_features());
  q.resize(rows * w.wq_b.out_features());
  // Each result's rows are finished where they are: the queries turned per head, the
  // window row normalized, turned and rounded to FP8, the indexer's queries turned and
  // rounded to its FP4, its head weights scaled by 1/√(Id·IH).
  const RowFinish q_finish{
      .heads = n_heads, .rope_freqs = &freqs[l], .first_position = a, .round = std::nullopt};
  const RowFinish kv_finish = WindowRowFinish(l, a);
  const RowFinish qi_finish{.heads = config.index_n_heads,
                            .rope_freqs = &freqs[l],
                            .first_position = a,
                            .round = KvFormat::kIndexK};
  RowFinish wts_finish;
  wts_finish.multiplier =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.index_head_dim)) /
                         std::sqrt(static_cast<double>(config.index_n_heads)));
  std::vector<GemmCall> calls = {
      {x.data(), rows, &w.wq_a, qr.data()},
      {x.data(), rows, &w.wkv, kv.data()},
      {nullptr, rows, &w.wq_b, q.data(), /*input_of=*/0, w.q_norm.data(), config.rms_norm_eps}};
  calls[1].finish = &kv_finish;
  calls[2].finish = &q_finish;
  if (qi != nullptr) {
    qi->resize(rows * w.i_wq_b.out_features());
    wts->resize(rows * w.i_weights.out_features());
    calls.push_back({nullptr, rows, &w.i_wq_b, qi->data(), /*input_of=*/0, w.q_norm.data(),
                     config.rms_norm_eps});
    calls.back().finish = &qi_finish;
    calls.push_back({x.data(), rows, &w.i_weights, wts->data()});
    calls.back().finish = &wts_finish;
  }
  AppendToGroup(calls, also);
  if (landing != nullptr) {
    mm->GemmGroupLater(calls);
    landing->push_back(std::move(qr));  // the chained products' input, landing too
  } else {
    mm->GemmGroup(calls);
  }
}

bool ModelImpl::Attention(SequenceState& s, int64_t l, int64_t a, int64_t b,
                          const std::vector<float>& x, bool compress, std::vector<float>& out,
                          PassState& pass, std::span<const GemmCall> also,
                          const std::function<const MoeSublayer*()>& then, bool later) const {
  const LayerPlan& plan = sched.layers[l];
  LayerState& ls = s.layers[l];
  const int64_t rows = b - a, ratio = plan.compress_ratio;
  const bool runs_indexer = ratio > 0 && plan.runs_indexer();
  std::vector<float> q, kv, qi, wts;
  CompressorInput compressor;
  std::vector<GemmCall> others(also.begin(), also.end());  // with the query path's group
  const bool compresses = ratio > 0 && plan.mode == AttentionMode::kFull && compress;
  if (compresses) CompressorCalls(s, l, a, b, x, compressor, others, later);
  QueriesAndWindowKv(l, a, rows, x, q, kv, runs_indexer ? &qi : nullptr,
                     runs_indexer ? &wts : nullptr, others, later ? &pass.landing : nullptr);
  // The earlier layers' selections held on the device were covered by that group's wait
  // (without one, they stay held: a later layer may read its source's there).
  if (!later) pass.Settle();
  auto& topk = pass.topk;
  auto& pool = pass.pool;
  const MoeSublayer* sublayer = then ? then() : nullptr;
  // Compressed KV and each query's selection of it.
  std::vector<std::vector<int32_t>>* selected = nullptr;
  std::unique_ptr<HeldSelection> held;    // the selection where the indexer left it
  const HeldSelection* reused = nullptr;  // an earlier layer's, still held
  const LayerState* kv_src = nullptr;
  if (ratio > 0) {
    if (compresses) Compress(s, l, compressor);
    kv_src = &s.layers[plan.kv_layer];
    if (runs_indexer) {
      const int64_t IH = config.index_n_heads, Id = config.index_head_dim;
      const LayerState& ks = s.layers[plan.index_k_layer];
      auto& sel = topk[l];
      sel.assign(rows, {});
      const int64_t max_cl = b / ratio;
      KVC_CHECK(max_cl <= ks.entries)
          << "layer " << l << " needs " << max_cl << " index keys, has " << ks.entries;
      IndexerBatch ib;
      ib.queries = rows;
      ib.heads = IH;
      ib.dim = Id;
      ib.qi = qi.data();
      ib.w = wts.data();
      ib.first_position = a;
      ib.ratio = ratio;
      ib.keys = ks.index_f.data();
      ib.key_rows = ks.entries;
      ib.pages = s.pages;
      ib.page_versions = s.page_versions;
      ib.sequence = s.id;
      ib.layout = &layout;
      ib.layer = plan.index_k_layer;
      ib.topk = config.index_topk;
      ib.block = config.candidate_block_size;
      ib.topk_blocks = config.candidate_topk_blocks;
      ib.pool = &pool;
      ib.selected = &sel;
      ib.matmul = mm.get();
      if (plan.is_candidate_source) {
        ib.pool_use = PoolUse::kProduce;
        pool.assign(rows, {});
      } else if (plan.candidate_pool_layer >= 0) {
        ib.pool_use = PoolUse::kApply;
        // The pool where the source's indexer left it (without a wait since, still held).
        if (const auto source = pass.held.find(plan.candidate_pool_layer);
            source != pass.held.end()) {
          ib.pool_held = source->second.get();
        }
      }
      if (later) ib.landing = mm.get();  // qi and wts still landing
      // Attention reads the selection where the indexer made it when it can (no wait in
      // between on a device); otherwise it is settled here (destroying it does).
      held = indexer->SelectHeld(ib);
      if (held == nullptr) {
        indexer->Select(ib);
      } else if (!attn->ReadsHeld(*held)) {
        held.reset();
      }
      selected = &sel;
    } else {
      // The source layer's selection where its indexer left it, or its host lists (after
      // the wait that lands them, when nothing has waited since).
      const auto source = pass.held.find(plan.topk_layer);
      if (later && source != pass.held.end() && attn->ReadsHeld(*source->second)) {
        reused = source->second.get();
      } else if (later) {
        mm->Settle();
        pass.Settle();
      }
      selected = &topk.at(plan.topk_layer);
    }
  }
  const HeldSelection* read_held = held != nullptr ? held.get() : reused;
  // Each query attends its window and its selected compressed rows. The window rows:
  // the ring (slot p % win holds position p), then this pass's own rows.
  std::vector<int32_t> offsets = {0}, entries;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = a + r;
    for (int64_t p = std::max(ls.window_start, i - window + 1); p <= i; ++p) {
      if (p >= a) {
        entries.push_back(static_cast<int32_t>(window + (p - a)));
      } else {
        KVC_CHECK(ls.ring_pos[p % window] == p)
            << "layer " << l << ": window row " << p << " missing";
        entries.push_back(static_cast<int32_t>(p % window));
      }
    }
    if (selected != nullptr && read_held == nullptr) {
      for (int32_t j : (*selected)[r]) entries.push_back(-j - 1);
    }
    offsets.push_back(static_cast<int32_t>(entries.size()));
  }
  AttentionBatch batch;
  batch.window = ls.ring;
  batch.fresh = kv.data();
  batch.fresh_rows = rows;
  batch.landing = later ? mm.get() : nullptr;
  batch.offsets = offsets;
  batch.entries = entries;
  if (selected != nullptr) {
    batch.compressed = kv_src->main_f.data();
    batch.pages = s.pages;
    batch.page_versions = s.page_versions;
    batch.sequence = s.id;
    batch.layout = &layout;
    batch.layer = plan.kv_layer;
    batch.held = read_held;
    batch.held_rows = b / ratio;  // query r sees rows [0, (a + r + 1) / ratio)
  }
  const bool moe_done = AttendAndProject(l, a, rows, q, batch, out, sublayer);
  if (held != nullptr) pass.held[l] = std::move(held);
  // The window ring keeps the last `win` rows of this pass (written when they land).
  for (int64_t p = std::max(a, b - window); p < b; ++p) {
    mm->CopyWhenLanded(kv.data() + (p - a) * head_dim, head_dim,
                       ls.ring.data() + (p % window) * head_dim);
    ls.ring_pos[p % window] = p;
  }
  if (later) {  // they land at the pass's next wait
    for (std::vector<float>* v : {&q, &kv, &qi, &wts, &compressor.kv, &compressor.score,
                                  &compressor.keys, &compressor.latents})
      pass.landing.push_back(std::move(*v));
  }
  return moe_done;
}

bool ModelImpl::AttendAndProject(int64_t l, int64_t a, int64_t rows, const std::vector<float>& q,
                                 AttentionBatch batch, std::vector<float>& out,
                                 const MoeSublayer* then) const {
  const AttentionWeights& w = layers[l].attn;
  // Sparse MQA: the same row is key and value; the sink enters the denominator only.
  batch.queries = rows;
  batch.heads = n_heads;
  batch.dim = head_dim;
  batch.q = q.data();
  batch.sink = w.sink.data();
  batch.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  // A device backend may run the whole path below where the attention output already is.
  OutputPath path;
  path.first_position = a;
  path.rope_freqs = &freqs[l];
  path.wo_a = w.wo_a;
  path.wo_b = &w.wo_b;
  path.matmul = mm.get();
  if (then != nullptr && attn->AttendThenMoe(batch, path, *then)) return true;
  out.resize(rows * w.wo_b.out_features());
  if (attn->AttendAndProject(batch, path, out.data())) return false;
  std::vector<float> o(rows * n_heads * head_dim);
  batch.out = o.data();
  attn->Attend(batch);
  cpu::ThreadPool::Default().ParallelFor(rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t h = 0; h < n_heads; ++h)
        cpu::ApplyRope(&o[(r * n_heads + h) * head_dim], head_dim, freqs[l], a + r,
                       /*inverse=*/true);
    }
  });
  // Grouped low-rank output.
  const int64_t G = config.o_groups, gw = n_heads * head_dim / G, ol = config.o_lora_rank;
  std::vector<float> u(rows * G * ol);
  std::vector<std::vector<float>> og(G, std::vector<float>(rows * gw)),
      ug(G, std::vector<float>(rows * ol));
  std::vector<GemmCall> calls;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy(o.begin() + r * n_heads * head_dim + g * gw,
                o.begin() + r * n_heads * head_dim + (g + 1) * gw, og[g].begin() + r * gw);
    calls.push_back({og[g].data(), rows, &w.wo_a[g], ug[g].data()});
  }
  mm->GemmGroup(calls);  // the groups' products together: one wait on a device
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy(ug[g].begin() + r * ol, ug[g].begin() + (r + 1) * ol,
                u.begin() + r * G * ol + g * ol);
  }
  out = Linear(u, rows, w.wo_b);
  return false;
}

}  // namespace kvc::model
