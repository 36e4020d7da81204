// The layer loop: embedding, Engram, each layer in order, the decoder compression, logits.
#include "engine/cpu/engram.h"
#include "engine/cpu/hyper_connections.h"
#include "engine/model/model_impl.h"

namespace kvc::model {

std::vector<float> ModelImpl::Embed(const SequenceState& s, int64_t a, int64_t b,
                                    std::vector<float>* pre) const {
  const int64_t rows = b - a;
  std::vector<float> X(rows * hc_mult * dim);
  pre->assign(rows * hc_mult, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* e = embed.data() + static_cast<int64_t>(s.tokens[a + r]) * dim;
    for (int64_t k = 0; k < hc_mult; ++k) std::copy(e, e + dim, X.data() + (r * hc_mult + k) * dim);
    (*pre)[r * hc_mult] = 1.0f;  // the first layer reads copy 0
  }
  return X;
}

GemmCall ModelImpl::EngramCall(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                               EngramProducts& p) const {
  const EngramWeights& eg = *layers[l].engram;
  const int64_t rows = b - a, n = config.engram_max_ngram_size, heads = config.engram_n_heads,
                ehd = config.engram_head_dim, width = (n - 1) * heads * ehd;
  // Compressed token ids: the identity map for configs whose vocabulary fits (small ones).
  p.in.assign(rows * width, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int64_t> ids =
        EngramRows(s.tokens, a + r, eg.multipliers, eg.primes, eg.offsets, heads,
                   config.engram_pad_token_id, config.engram_compressed_vocab_size);
    for (size_t slot = 0; slot < ids.size(); ++slot) {
      std::copy(eg.table.begin() + ids[slot] * ehd, eg.table.begin() + (ids[slot] + 1) * ehd,
                p.in.begin() + r * width + slot * ehd);
    }
  }
  p.kv.resize(rows * eg.wkv.out_features());  // rows × (hc+1)·D
  return {p.in.data(), rows, &eg.wkv, p.kv.data()};
}

void ModelImpl::MixEngram(int64_t l, int64_t rows, const EngramProducts& p,
                          std::vector<float>& X) const {
  const EngramWeights& eg = *layers[l].engram;
  for (int64_t r = 0; r < rows; ++r) {
    const float* V = p.kv.data() + (r * (hc_mult + 1) + hc_mult) * dim;
    for (int64_t k = 0; k < hc_mult; ++k) {
      float* h = X.data() + (r * hc_mult + k) * dim;
      const float* K = p.kv.data() + (r * (hc_mult + 1) + k) * dim;
      cpu::EngramAdd(h, cpu::EngramGate(h, &eg.qw[k * dim], &eg.kw[k * dim], K, dim), V, dim);
    }
  }
}

void ModelImpl::ApplyEngram(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                            std::vector<float>& X) const {
  EngramProducts p;
  const GemmCall call = EngramCall(s, l, a, b, p);
  mm->GemmGroup(std::span(&call, 1));
  MixEngram(l, b - a, p, X);
}

bool ModelImpl::RunLayers(SequenceState& s, int64_t l0, int64_t l1, int64_t a, int64_t b,
                          std::vector<float>& X, std::vector<float>& pre, bool compress,
                          std::vector<float>* main_hidden, std::vector<float>* head_input) const {
  const int64_t rows = b - a, mix = (2 + hc_mult) * hc_mult;
  PassState pass;
  std::vector<float> xin(rows * dim), y, R;
  std::vector<cpu::HcCoefficients> coef(rows);
  std::vector<float> a1(rows * hc_mult), post(rows * hc_mult), comb(rows * hc_mult * hc_mult);
  MoeSublayer sublayer;
  // The mixes of one sublayer for every row: m = (fn · vec X) · rsqrt(mean(vec X²) + 1e-20).
  // The product fn · vec X needs only X, and the sublayer's input mixes with the previous
  // sublayer's coefficients, so it goes with the sublayer's first group of products (one
  // wait fewer on a device); `coefficients` finishes once that group is done, before X
  // changes.
  std::vector<float> mixes(rows * mix);
  auto mixes_product = [&](const LayerWeights& w, int sub) {
    return GemmCall{X.data(), rows, &w.hc_fn[sub], mixes.data()};
  };
  auto coefficients = [&](const LayerWeights& w, int sub) {
    for (int64_t r = 0; r < rows; ++r) {
      cpu::HcScaleMixesRow(&X[r * hc_mult * dim], hc_mult * dim, &mixes[r * mix], mix);
      coef[r] = cpu::HcFromMixes(Row(mixes, r, mix), w.hc_base[sub], w.hc_scale[sub], hc_mult,
                                 config.hc_sinkhorn_iters, config.hc_eps);
    }
  };
  // Engram's products need only the tokens: those of an Engram layer after the first go
  // with the previous layer's query path (no wait of their own on a device, and the step
  // into the layer reads them where they land); a layer's are dropped once a wait of the
  // loop's has passed it.
  std::map<int64_t, EngramProducts> engram;
  // When the device ran the previous layer's end into this layer's input (MoeSublayer::
  // Next), X, pre and xin land only when the query path's products return: what reads X
  // waits until then.
  bool input_on_device = false;
  MoeSublayer::Next next;
  // The drafter's targets' inputs, their hc copies' mean side by side per row (sized once:
  // the device may deliver into it later); `target_mean(l)`: where layer l's goes, if at all.
  const int64_t mean_width = static_cast<int64_t>(targets.size()) * dim;
  auto target_mean = [&](int64_t l) -> float* {
    if (main_hidden == nullptr || l >= n_layers || !sched.layers[l].is_dspark_target)
      return nullptr;
    const int64_t t = std::find(targets.begin(), targets.end(), l) - targets.begin();
    return main_hidden->data() + t * dim;
  };
  for (int64_t l = l0; l < l1 && main_hidden != nullptr; ++l) {
    if (l < n_layers && sched.layers[l].is_dspark_target) main_hidden->resize(rows * mean_width);
  }
  MoeSublayer::Coefficients from_mixes;
  for (int64_t l = l0; l < l1; ++l) {
    const LayerWeights& w = layers[l];
    // The step into this layer on the device brought its input's mean too (MoeSublayer::Next).
    const bool mean_landing = input_on_device && next.mean != nullptr;
    // A layer whose host steps need nothing of its query path's products goes without a
    // wait for them (Attention's `later`): its compressor's rows join the pending group
    // where they land, the entries it completes are written where the products are (or,
    // when the attention backend cannot, after a wait: Compress settles); its indexer reads
    // its queries and head weights where they land, its input is not read on the host (a
    // drafter's target's mean comes with it from the device), and a later layer of the pass
    // waits before the buffers they land in go.
    const bool later = l < n_layers && l + 1 < l1 && (target_mean(l) == nullptr || mean_landing);
    if (input_on_device || !w.engram) {
      // no Engram, or the device gated it in with the step into this layer
    } else if (engram.contains(l)) {
      mm->Settle();  // the products went with the first group, which may not have waited
      MixEngram(l, rows, engram.at(l), X);
    } else {
      ApplyEngram(s, l, a, b, X);
    }
    auto layer_input = [&] {  // X holds the layer's input
      if (float* m = target_mean(l); m != nullptr && !mean_landing) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < dim; ++i)
            m[r * mean_width + i] = cpu::HcMeanAt(&X[r * hc_mult * dim], hc_mult, dim, i);
        }
      }
      R = X;
    };
    // Attention sublayer: its input mixes with the previous sublayer's coefficients.
    if (!input_on_device) {
      layer_input();
      for (int64_t r = 0; r < rows; ++r) {
        cpu::HcPre(&X[r * hc_mult * dim], &pre[r * hc_mult], hc_mult, dim, &xin[r * dim]);
        cpu::RmsNorm(&xin[r * dim], w.attn_norm.data(), dim, config.rms_norm_eps, &xin[r * dim]);
      }
    }
    std::vector<GemmCall> attn_also = {mixes_product(w, 0)};
    if (l + 1 < l1 && layers[l + 1].engram)
      attn_also.push_back(EngramCall(s, l + 1, a, b, engram[l + 1]));
    // The attention sublayer's coefficients need only X and its mixes, both there once the
    // query path's products are done; so everything the MoE sublayer takes but attention's
    // output is known before attention runs, and a device can queue the two together.
    // With a next layer whose Engram (if any) has its products done, the device may carry
    // on into its input too.
    const bool step_into_next = l + 1 < l1 && (!layers[l + 1].engram || engram.contains(l + 1));
    const bool step_into_head = l + 1 == l1 && head_input != nullptr && l < n_layers;
    auto attention_coefficients = [&] {  // on the host: coef, and a1, post, comb from it
      coefficients(w, 0);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(coef[r].pre.begin(), coef[r].pre.end(), a1.begin() + r * hc_mult);
        std::copy(coef[r].post.begin(), coef[r].post.end(), post.begin() + r * hc_mult);
        std::copy(coef[r].comb.begin(), coef[r].comb.end(), comb.begin() + r * hc_mult * hc_mult);
      }
    };
    auto moe_sublayer = [&]() -> const MoeSublayer* {
      y.resize(rows * dim);
      if (later) {  // X and the mixes are still landing: R is X, the coefficients its mixes'
        from_mixes = {mixes.data(), w.hc_base[0], w.hc_scale[0], config.hc_sinkhorn_iters,
                      config.hc_eps};
        sublayer = {hc_mult,
                    X.data(),
                    nullptr,
                    nullptr,
                    nullptr,
                    w.ffn_norm,
                    config.rms_norm_eps,
                    &w.hc_fn[1],
                    MoeBlockOf(l),
                    X.data(),
                    mixes.data(),
                    y.data()};
        sublayer.coefficients = &from_mixes;
      } else {
        if (input_on_device) layer_input();
        attention_coefficients();
        // The stream after attention overwrites X (R holds the stream before it).
        sublayer = {hc_mult,       R.data(),   post.data(),         comb.data(),
                    a1.data(),     w.ffn_norm, config.rms_norm_eps, &w.hc_fn[1],
                    MoeBlockOf(l), X.data(),   mixes.data(),        y.data()};
      }
      if (step_into_next || step_into_head) {
        next = {};
        next.base = w.hc_base[1];
        next.scale = w.hc_scale[1];
        next.iters = config.hc_sinkhorn_iters;
        next.hc_eps = config.hc_eps;
        next.stream = X.data();
        next.pre = pre.data();
        if (step_into_head) {  // the head's input: the final norm instead of a layer's
          head_input->resize(rows * dim);
          next.norm = norm;
          next.input = head_input->data();
        } else {
          next.norm = layers[l + 1].attn_norm;
          next.input = xin.data();
        }
        if (float* m = step_into_next ? target_mean(l + 1) : nullptr) {
          next.mean = m;
          next.mean_stride = mean_width;
        }
        if (step_into_next && layers[l + 1].engram) {
          const EngramWeights& eg = *layers[l + 1].engram;
          next.engram_kv = engram.at(l + 1).kv.data();
          next.engram_qw = eg.qw;
          next.engram_kw = eg.kw;
        }
        sublayer.next = &next;
      }
      return &sublayer;
    };
    bool moe_done = false;
    if (l < n_layers) {
      moe_done = Attention(s, l, a, b, xin, compress, y, pass, attn_also, moe_sublayer, later);
      if (!later) engram.erase(engram.begin(), engram.upper_bound(l));  // landed, and read
      if (later && !moe_done) {  // the host runs the sublayer: it needs X and the mixes
        mm->Settle();
        if (input_on_device) layer_input();
        attention_coefficients();
      }
    } else {
      DraftAttention(s, l, a, b, xin, y, attn_also);
      moe_sublayer();
    }
    if (moe_done && step_into_head) return true;  // X, pre and the head input land later
    input_on_device = moe_done && step_into_next;
    if (input_on_device) continue;  // X, pre and xin: the next layer's, landing with its products
    if (moe_done) {  // X is the stream after attention; the MoE's output and mixes are in
      R = X;
    } else {
      for (int64_t r = 0; r < rows; ++r)
        cpu::HcPost(&y[r * dim], &R[r * hc_mult * dim], coef[r], hc_mult, dim,
                    &X[r * hc_mult * dim]);
      // MoE sublayer.
      R = X;
      for (int64_t r = 0; r < rows; ++r) {
        cpu::HcPre(&X[r * hc_mult * dim], &a1[r * hc_mult], hc_mult, dim, &xin[r * dim]);
        cpu::RmsNorm(&xin[r * dim], w.ffn_norm.data(), dim, config.rms_norm_eps, &xin[r * dim]);
      }
      const GemmCall ffn_mixes = mixes_product(w, 1);
      Moe(l, xin, rows, y, std::span(&ffn_mixes, 1));
    }
    coefficients(w, 1);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::HcPost(&y[r * dim], &R[r * hc_mult * dim], coef[r], hc_mult, dim, &X[r * hc_mult * dim]);
      std::copy(coef[r].pre.begin(), coef[r].pre.end(), pre.begin() + r * hc_mult);
    }
  }
  return false;
}

void ModelImpl::CompressDecoder(SequenceState& s, int64_t a, int64_t b, std::vector<float> X,
                                const std::vector<float>& pre) const {
  const int64_t l = decoder_full;
  if (layers[l].engram) ApplyEngram(s, l, a, b, X);
  const int64_t rows = b - a;
  std::vector<float> xin(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    cpu::HcPre(&X[r * hc_mult * dim], &pre[r * hc_mult], hc_mult, dim, &xin[r * dim]);
    cpu::RmsNorm(&xin[r * dim], layers[l].attn_norm.data(), dim, config.rms_norm_eps,
                 &xin[r * dim]);
  }
  Compress(s, l, a, b, xin);
}

void ModelImpl::HeadInput(const std::vector<float>& X, const std::vector<float>& pre, int64_t row,
                          const std::vector<float>& final_norm, float* x) const {
  cpu::HcPre(&X[row * hc_mult * dim], &pre[row * hc_mult], hc_mult, dim, x);
  cpu::RmsNorm(x, final_norm.data(), dim, config.rms_norm_eps, x);
}

std::vector<float> ModelImpl::Logits(const std::vector<float>& X, const std::vector<float>& pre,
                                     int64_t row, const std::vector<float>* final_norm) const {
  std::vector<float> x(dim), logits(config.vocab_size);
  HeadInput(X, pre, row, final_norm ? *final_norm : norm, x.data());
  mm->Gemm(x.data(), 1, head, logits.data());
  return logits;
}

std::vector<std::vector<float>> ModelImpl::LayersToLogits(SequenceState& s, int64_t l0, int64_t a,
                                                          int64_t b, std::vector<float>& X,
                                                          std::vector<float>& pre, bool compress,
                                                          std::span<const int64_t> rows) const {
  std::vector<float> main_hidden, head_input;
  const bool at_head =
      RunLayers(s, l0, n_layers, a, b, X, pre, compress, &main_hidden, &head_input);
  return FinishPass(s, a, b, main_hidden, X, pre, rows, at_head ? &head_input : nullptr);
}

std::vector<std::vector<float>> ModelImpl::FinishPass(SequenceState& s, int64_t a, int64_t b,
                                                      const std::vector<float>& main_hidden,
                                                      const std::vector<float>& X,
                                                      const std::vector<float>& pre,
                                                      std::span<const int64_t> rows,
                                                      const std::vector<float>* head_in) const {
  const int64_t n = static_cast<int64_t>(rows.size()), V = config.vocab_size;
  std::vector<float> x, logits(n * V);
  const float* in = nullptr;
  if (head_in != nullptr && n > 0) {  // where RunLayers left them (X, pre not landed yet)
    for (int64_t i = 1; i < n; ++i) KVC_CHECK(rows[i] == rows[0] + i) << "head rows not in a run";
    in = head_in->data() + rows[0] * dim;
  } else {
    x.resize(n * dim);
    for (int64_t i = 0; i < n; ++i) HeadInput(X, pre, rows[i], norm, &x[i * dim]);
    in = x.data();
  }
  std::vector<GemmCall> calls = {{in, n, &head, logits.data()}};
  DraftRingProducts rings;
  DraftRingCalls(a, b, main_hidden, rings, calls);
  mm->GemmGroup(calls);
  if (draft_layers > 0) WriteDraftRings(s, rings);
  std::vector<std::vector<float>> out;
  for (int64_t i = 0; i < n; ++i)
    out.emplace_back(logits.begin() + i * V, logits.begin() + (i + 1) * V);
  return out;
}

}  // namespace kvc::model
