// Weights: safetensors tensors into compute form (packed matrices, FP8/FP4 dequantized).
#include "base/status_macros.h"
#include "engine/model/model_impl.h"

namespace kvc::model {

std::unique_ptr<SequenceState> ModelImpl::NewState() const {
  auto s = std::make_unique<SequenceState>();
  s->chunk_tokens = layout.chunk_tokens;
  s->layers.resize(n_layers + draft_layers);
  for (LayerState& ls : s->layers) {
    ls.ring.assign(window * head_dim, 0.0f);
    ls.ring_pos.assign(window, -1);
  }
  return s;
}

absl::Status ModelImpl::CheckTokens(std::span<const uint32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= static_cast<uint32_t>(config.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", i, " is ", tokens[i], ", outside the vocabulary of ", config.vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelImpl::LoadWeights(const SafetensorsFile& f) {
  const std::vector<ParameterSpec> specs = ModelParameters(config, sched);
  std::set<std::string> expected;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParameterSpec& p : specs) {
    expected.insert(p.name);
    shapes[p.name] = p.shape;
  }
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
  // A matrix takes its shape from the parameter table (weights.cc), the one place where
  // tensor names and shapes are written.
  auto mat = [&](const std::string& n) {
    const std::vector<int64_t>& shape = shapes.at(n);
    return PackedMatrix(t.at(n), shape[0], shape[1]);
  };
  embed = take("embed.weight");
  norm = take("norm.weight");
  head = mat("head.weight");
  KVC_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> primes, EngramPrimes(config));
  layers.resize(n_layers + draft_layers);
  // What every block has (trunk and draft).
  auto load_block = [&](int64_t l, int64_t experts, int64_t per_token) {
    LayerWeights& w = layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    w.attn_norm = take(p + "attn_norm.weight");
    w.ffn_norm = take(p + "ffn_norm.weight");
    const char* subs[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; ++s) {
      w.hc_fn[s] = mat(absl::StrCat(p, "hc_", subs[s], "_fn"));
      w.hc_base[s] = take(absl::StrCat(p, "hc_", subs[s], "_base"));
      w.hc_scale[s] = take(absl::StrCat(p, "hc_", subs[s], "_scale"));
    }
    AttentionWeights& a = w.attn;
    const std::string at = p + "attn.";
    a.wq_a = mat(at + "wq_a.weight");
    a.q_norm = take(at + "q_norm.weight");
    a.wq_b = mat(at + "wq_b.weight");
    a.wkv = mat(at + "wkv.weight");
    a.kv_norm = take(at + "kv_norm.weight");
    a.sink = take(at + "attn_sink");
    const int64_t G = config.o_groups, gw = n_heads * head_dim / G;
    const std::vector<float>& wo_a = t.at(at + "wo_a.weight");
    for (int64_t g = 0; g < G; ++g) {
      a.wo_a.emplace_back(std::span<const float>(wo_a.data() + g * config.o_lora_rank * gw,
                                                 config.o_lora_rank * gw),
                          config.o_lora_rank, gw);
    }
    a.wo_b = mat(at + "wo_b.weight");
    const std::string ff = p + "ffn.";
    w.gate = mat(ff + "gate.weight");
    w.gate_bias = take(ff + "gate.bias");
    auto expert = [&](const std::string& e) {
      return ExpertWeights{mat(e + "w1.weight"), mat(e + "w3.weight"), mat(e + "w2.weight")};
    };
    for (int64_t e = 0; e < experts; ++e)
      w.experts.push_back(expert(absl::StrCat(ff, "experts.", e, ".")));
    w.experts_per_token = per_token;
    w.shared = expert(ff + "shared_experts.");
  };
  for (int64_t l = n_layers; l < n_layers + draft_layers; ++l) {
    load_block(l, config.dspark_n_routed_experts, config.dspark_num_experts_per_tok);
  }
  if (draft_layers > 0) {
    draft.main_proj = mat("dspark.main_proj.weight");
    draft.main_norm = take("dspark.main_norm.weight");
    draft.norm = take("dspark.norm.weight");
    draft.markov_embed = take("dspark.markov.embed");
    draft.markov_head = mat("dspark.markov.head");
  }
  for (int64_t l = 0; l < n_layers; ++l) {
    const LayerPlan& plan = sched.layers[l];
    load_block(l, config.n_routed_experts, config.num_experts_per_tok);
    LayerWeights& w = layers[l];
    AttentionWeights& a = w.attn;
    const std::string p = absl::StrCat("layers.", l, ".");
    const std::string at = p + "attn.";
    if (plan.mode == AttentionMode::kFull) {
      a.c_wkv = mat(at + "compressor.wkv.weight");
      if (plan.compress_ratio > 1) a.c_wgate = mat(at + "compressor.wgate.weight");
      a.c_norm = take(at + "compressor.norm.weight");
      a.i_wk = mat(at + "indexer.wk.weight");
      a.i_k_norm = take(at + "indexer.k_norm.weight");
    }
    if (plan.runs_indexer()) {
      a.i_wq_b = mat(at + "indexer.wq_b.weight");
      a.i_weights = mat(at + "indexer.weights_proj.weight");
    }
    if (plan.has_engram) {
      size_t slot = 0;
      while (config.engram_layer_ids[slot] != l) ++slot;
      if (config.engram_multipliers.empty()) {
        return absl::InvalidArgumentError(
            "the config has Engram layers but no engram_multipliers (scripts/"
            "engram_multipliers.py prints them for a config)");
      }
      auto eg = std::make_unique<EngramWeights>();
      const std::string e = p + "engram.";
      eg->table = take(e + "table");
      eg->wkv = mat(e + "wkv.weight");
      eg->qw = take(e + "qw");
      eg->kw = take(e + "kw");
      eg->primes = (primes)[slot];
      int64_t off = 0;
      for (int64_t pr : eg->primes) {
        eg->offsets.push_back(off);
        off += pr;
      }
      eg->multipliers = config.engram_multipliers[slot];
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
