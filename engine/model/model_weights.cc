// Weights: safetensors tensors into compute form (packed matrices, FP8/FP4 dequantized).
#include "base/status_macros.h"
#include "engine/model/model_impl.h"

namespace kvc::model {

std::unique_ptr<SequenceState> ModelImpl::NewState() const {
  auto s = std::make_unique<SequenceState>();
  s->chunk_tokens = layout.chunk_tokens;
  s->layers.resize(L + ND);
  for (LayerState& ls : s->layers) {
    ls.ring.assign(win * hd, 0.0f);
    ls.ring_pos.assign(win, -1);
  }
  return s;
}

absl::Status ModelImpl::CheckTokens(std::span<const uint32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= static_cast<uint32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " is ", tokens[i],
                                                     ", outside the vocabulary of ", c.vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelImpl::LoadWeights(const SafetensorsFile& f) {
  const std::vector<ParameterSpec> specs = ModelParameters(c, sched);
  std::set<std::string> expected;
  for (const ParameterSpec& p : specs) expected.insert(p.name);
  for (const auto& [name, t] : f.tensors()) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tensor \"", name, "\" is not part of this config's model"));
    }
  }
  std::map<std::string, std::vector<float>> t;
  for (const ParameterSpec& p : specs) {
    KVC_ASSIGN_OR_RETURN(std::vector<float> v, f.ReadF32(p.name, p.shape));
    t[p.name] = std::move(v);
  }
  auto take = [&](const std::string& n) { return std::move(t.at(n)); };
  auto mat = [&](const std::string& n, int64_t rows, int64_t cols) {
    return PackedMatrix(t.at(n), rows, cols);
  };
  embed = take("embed.weight");
  norm = take("norm.weight");
  head = mat("head.weight", c.vocab_size, D);
  KVC_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> primes, EngramPrimes(c));
  layers.resize(L + ND);
  // What every block has (trunk and draft).
  auto load_block = [&](int64_t l, int64_t experts, int64_t per_token) {
    LayerWeights& w = layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    w.attn_norm = take(p + "attn_norm.weight");
    w.ffn_norm = take(p + "ffn_norm.weight");
    const char* subs[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; ++s) {
      w.hc_fn[s] = mat(absl::StrCat(p, "hc_", subs[s], "_fn"), (2 + hc) * hc, hc * D);
      w.hc_base[s] = take(absl::StrCat(p, "hc_", subs[s], "_base"));
      w.hc_scale[s] = take(absl::StrCat(p, "hc_", subs[s], "_scale"));
    }
    AttentionWeights& a = w.attn;
    const std::string at = p + "attn.";
    a.wq_a = mat(at + "wq_a.weight", c.q_lora_rank, D);
    a.q_norm = take(at + "q_norm.weight");
    a.wq_b = mat(at + "wq_b.weight", H * hd, c.q_lora_rank);
    a.wkv = mat(at + "wkv.weight", hd, D);
    a.kv_norm = take(at + "kv_norm.weight");
    a.sink = take(at + "attn_sink");
    const int64_t G = c.o_groups, gw = H * hd / G;
    const std::vector<float>& wo_a = t.at(at + "wo_a.weight");
    for (int64_t g = 0; g < G; ++g) {
      a.wo_a.emplace_back(
          std::span<const float>(wo_a.data() + g * c.o_lora_rank * gw, c.o_lora_rank * gw),
          c.o_lora_rank, gw);
    }
    a.wo_b = mat(at + "wo_b.weight", D, G * c.o_lora_rank);
    const std::string ff = p + "ffn.";
    w.gate = mat(ff + "gate.weight", experts, D);
    w.gate_bias = take(ff + "gate.bias");
    const int64_t I = c.moe_intermediate_size;
    auto expert = [&](const std::string& e) {
      return ExpertWeights{mat(e + "w1.weight", I, D), mat(e + "w3.weight", I, D),
                           mat(e + "w2.weight", D, I)};
    };
    for (int64_t e = 0; e < experts; ++e)
      w.experts.push_back(expert(absl::StrCat(ff, "experts.", e, ".")));
    w.experts_per_token = per_token;
    w.shared = expert(ff + "shared_experts.");
  };
  for (int64_t l = L; l < L + ND; ++l) {
    load_block(l, c.dspark_n_routed_experts, c.dspark_num_experts_per_tok);
  }
  if (ND > 0) {
    const int64_t nt = static_cast<int64_t>(targets.size());
    draft.main_proj = mat("dspark.main_proj.weight", D, nt * D);
    draft.main_norm = take("dspark.main_norm.weight");
    draft.norm = take("dspark.norm.weight");
    draft.markov_embed = take("dspark.markov.embed");
    draft.markov_head = mat("dspark.markov.head", c.vocab_size, c.dspark_markov_rank);
  }
  for (int64_t l = 0; l < L; ++l) {
    const LayerPlan& plan = sched.layers[l];
    load_block(l, c.n_routed_experts, c.num_experts_per_tok);
    LayerWeights& w = layers[l];
    AttentionWeights& a = w.attn;
    const std::string p = absl::StrCat("layers.", l, ".");
    const std::string at = p + "attn.";
    if (plan.mode == AttentionMode::kFull) {
      a.c_wkv = mat(at + "compressor.wkv.weight", hd, D);
      if (plan.compress_ratio > 1) a.c_wgate = mat(at + "compressor.wgate.weight", hd, D);
      a.c_norm = take(at + "compressor.norm.weight");
      a.i_wk = mat(at + "indexer.wk.weight", c.index_head_dim, hd);
      a.i_k_norm = take(at + "indexer.k_norm.weight");
    }
    if (plan.runs_indexer()) {
      a.i_wq_b = mat(at + "indexer.wq_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      a.i_weights = mat(at + "indexer.weights_proj.weight", c.index_n_heads, D);
    }
    if (plan.has_engram) {
      size_t slot = 0;
      while (c.engram_layer_ids[slot] != l) ++slot;
      if (c.engram_multipliers.empty()) {
        return absl::InvalidArgumentError(
            "the config has Engram layers but no engram_multipliers (scripts/"
            "engram_multipliers.py prints them for a config)");
      }
      auto eg = std::make_unique<EngramWeights>();
      const std::string e = p + "engram.";
      const int64_t width = (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim;
      eg->table = take(e + "table");
      eg->wkv = mat(e + "wkv.weight", (hc + 1) * D, width);
      eg->qw = take(e + "qw");
      eg->kw = take(e + "kw");
      eg->primes = (primes)[slot];
      int64_t off = 0;
      for (int64_t pr : eg->primes) {
        eg->offsets.push_back(off);
        off += pr;
      }
      eg->multipliers = c.engram_multipliers[slot];
      w.engram = std::move(eg);
    }
  }
  return absl::OkStatus();
}

void ModelImpl::ForEachWeight(const std::function<void(const PackedMatrix&)>& fn) const {
  auto each = [&](const PackedMatrix& w) {
    if (w.out_features() > 0) fn(w);
  };
  each(head);
  for (const LayerWeights& w : layers) {
    for (const PackedMatrix& h : w.hc_fn) each(h);
    const AttentionWeights& a = w.attn;
    for (const PackedMatrix* p : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_b, &a.c_wkv, &a.c_wgate, &a.i_wk,
                                  &a.i_wq_b, &a.i_weights, &w.gate}) {
      each(*p);
    }
    for (const PackedMatrix& g : a.wo_a) each(g);
    for (const ExpertWeights& e : w.experts) {
      each(e.w1), each(e.w3), each(e.w2);
    }
    each(w.shared.w1), each(w.shared.w3), each(w.shared.w2);
    if (w.engram) each(w.engram->wkv);
  }
  each(draft.main_proj), each(draft.markov_head);
}

}  // namespace kvc::model
