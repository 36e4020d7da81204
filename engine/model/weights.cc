#include "engine/model/weights.h"

#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/splitmix.h"

namespace kvc::model {
namespace {

// Weights must be the same on every machine: base/splitmix.h.
uint64_t Mix(uint64_t& s) { return SplitMix64(s); }

uint64_t NameSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// Uniform on (-1, 1) times sqrt(3): unit variance.
float UnitUniform(uint64_t& s) {
  const double u = static_cast<double>(Mix(s) >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>((2.0 * u - 1.0) * std::sqrt(3.0));
}

std::vector<float> Fill(const ParameterSpec& p, const ModelConfig& c, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  std::vector<float> v(n);
  uint64_t s = NameSeed(seed, p.name);
  const int64_t in = p.shape.size() == 2 ? p.shape[1] : 1;
  const double layers = static_cast<double>(c.num_hidden_layers);
  double std = 1.0;
  switch (p.init) {
    case InitKind::kLinear:
      std = 1.0 / std::sqrt(static_cast<double>(in));
      break;
    case InitKind::kOutLinear:
      std = 1.0 / std::sqrt(static_cast<double>(in) * 2.0 * layers);
      break;
    case InitKind::kEmbedding:
    case InitKind::kTable:
      std = 1.0;
      break;
    case InitKind::kSmall:
      std = 0.1;
      break;
    case InitKind::kSink:
      std = 0.5;
      break;
    case InitKind::kHcFn:
      std = 0.1 / std::sqrt(static_cast<double>(in));
      break;
    case InitKind::kNorm:
      for (float& x : v) x = 1.0f + 0.1f * UnitUniform(s);
      return v;
    case InitKind::kHcScale:
      for (float& x : v) x = 1.0f;
      return v;
    case InitKind::kHcBase: {
      const int64_t hc = c.hc_mult;
      for (float& x : v) x = 0.0f;
      for (int64_t j = 0; j < hc; ++j) v[2 * hc + j * hc + j] = 4.0f;
      return v;
    }
  }
  for (float& x : v) x = static_cast<float>(std * UnitUniform(s));
  return v;
}

bool IsPrime(int64_t n) {
  if (n < 2) return false;
  for (int64_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

}  // namespace

std::vector<ParameterSpec> ModelParameters(const ModelConfig& c, const LayerSchedule& schedule) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim, G = c.o_groups,
                hc = c.hc_mult, mix = (2 + hc) * hc;
  std::vector<ParameterSpec> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, InitKind kind) {
    out.push_back({std::move(name), std::move(shape), kind});
  };
  add("embed.weight", {c.vocab_size, D}, InitKind::kEmbedding);
  // What every block has (trunk and draft): norms, hc mixes, the SWA side of attention,
  // the output projections and an MoE of `experts` routed experts plus a shared one.
  auto block = [&](int64_t l, int64_t experts) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "attn_norm.weight", {D}, InitKind::kNorm);
    add(p + "ffn_norm.weight", {D}, InitKind::kNorm);
    for (const char* s : {"attn", "ffn"}) {
      add(absl::StrCat(p, "hc_", s, "_fn"), {mix, hc * D}, InitKind::kHcFn);
      add(absl::StrCat(p, "hc_", s, "_base"), {mix}, InitKind::kHcBase);
      add(absl::StrCat(p, "hc_", s, "_scale"), {3}, InitKind::kHcScale);
    }
    const std::string a = p + "attn.";
    add(a + "wq_a.weight", {c.q_lora_rank, D}, InitKind::kLinear);
    add(a + "q_norm.weight", {c.q_lora_rank}, InitKind::kNorm);
    add(a + "wq_b.weight", {H * hd, c.q_lora_rank}, InitKind::kLinear);
    add(a + "wkv.weight", {hd, D}, InitKind::kLinear);
    add(a + "kv_norm.weight", {hd}, InitKind::kNorm);
    add(a + "attn_sink", {H}, InitKind::kSink);
    add(a + "wo_a.weight", {G * c.o_lora_rank, H * hd / G}, InitKind::kLinear);
    add(a + "wo_b.weight", {D, G * c.o_lora_rank}, InitKind::kOutLinear);
    const std::string f = p + "ffn.";
    add(f + "gate.weight", {experts, D}, InitKind::kLinear);
    add(f + "gate.bias", {experts}, InitKind::kSmall);
    const int64_t I = c.moe_intermediate_size;
    auto expert = [&](const std::string& e) {
      add(e + "w1.weight", {I, D}, InitKind::kLinear);
      add(e + "w3.weight", {I, D}, InitKind::kLinear);
      add(e + "w2.weight", {D, I}, InitKind::kOutLinear);
    };
    for (int64_t e = 0; e < experts; ++e) expert(absl::StrCat(f, "experts.", e, "."));
    expert(f + "shared_experts.");
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerPlan& plan = schedule.layers[l];
    block(l, c.n_routed_experts);
    const std::string a = absl::StrCat("layers.", l, ".attn.");
    if (plan.mode == AttentionMode::kFull) {
      add(a + "compressor.wkv.weight", {hd, D}, InitKind::kLinear);
      if (plan.compress_ratio > 1) add(a + "compressor.wgate.weight", {hd, D}, InitKind::kLinear);
      add(a + "compressor.norm.weight", {hd}, InitKind::kNorm);
      add(a + "indexer.wk.weight", {c.index_head_dim, hd}, InitKind::kLinear);
      add(a + "indexer.k_norm.weight", {c.index_head_dim}, InitKind::kNorm);
    }
    if (plan.runs_indexer()) {
      add(a + "indexer.wq_b.weight", {c.index_n_heads * c.index_head_dim, c.q_lora_rank},
          InitKind::kLinear);
      add(a + "indexer.weights_proj.weight", {c.index_n_heads, D}, InitKind::kLinear);
    }
    if (plan.has_engram) {
      size_t slot = 0;
      while (c.engram_layer_ids[slot] != l) ++slot;
      const int64_t orders = c.engram_max_ngram_size - 1;
      const int64_t width = orders * c.engram_n_heads * c.engram_head_dim;
      const std::string e = absl::StrCat("layers.", l, ".engram.");
      add(e + "table", {c.engram_num_embeddings[slot], c.engram_head_dim}, InitKind::kTable);
      add(e + "wkv.weight", {(hc + 1) * D, width}, InitKind::kLinear);
      add(e + "qw", {hc, D}, InitKind::kNorm);
      add(e + "kw", {hc, D}, InitKind::kNorm);
    }
  }
  add("norm.weight", {D}, InitKind::kNorm);
  add("head.weight", {c.vocab_size, D}, InitKind::kLinear);
  // DSpark drafter: its blocks (SWA attention over the main model's hidden states and the
  // draft block, an MoE of its own), the main-hidden projection, its final norm and the
  // Markov head's low-rank bigram bias. The output head is the trunk's (tied).
  if (c.num_nextn_predict_layers > 0) {
    const int64_t targets = static_cast<int64_t>(c.dspark_target_layer_ids.size());
    add("dspark.main_proj.weight", {D, targets * D}, InitKind::kLinear);
    add("dspark.main_norm.weight", {D}, InitKind::kNorm);
    add("dspark.norm.weight", {D}, InitKind::kNorm);
    add("dspark.markov.embed", {c.vocab_size, c.dspark_markov_rank}, InitKind::kEmbedding);
    add("dspark.markov.head", {c.vocab_size, c.dspark_markov_rank}, InitKind::kLinear);
    for (int64_t l = c.num_hidden_layers; l < c.total_layers(); ++l) {
      block(l, c.dspark_n_routed_experts);
    }
  }
  return out;
}

absl::Status WriteRandomWeights(const ModelConfig& config, const LayerSchedule& schedule,
                                uint64_t seed, const std::string& path) {
  std::vector<NamedTensor> tensors;
  for (const ParameterSpec& p : ModelParameters(config, schedule)) {
    tensors.push_back({p.name, p.shape, Fill(p, config, seed)});
  }
  return WriteSafetensors(path, tensors,
                          {{"format", "kvcache-v41"},
                           {"seed", absl::StrCat(seed)},
                           {"model_type", config.model_type},
                           {"hidden_size", absl::StrCat(config.hidden_size)},
                           {"num_hidden_layers", absl::StrCat(config.num_hidden_layers)}});
}

ActiveParameters CountActiveParameters(const ModelConfig& c, const LayerSchedule& schedule) {
  ActiveParameters a;
  const int64_t E = schedule.encoder_layers;
  for (const ParameterSpec& p : ModelParameters(c, schedule)) {
    double n = 1;
    for (int64_t d : p.shape) n *= static_cast<double>(d);
    int64_t layer = -1;
    if (p.name.rfind("layers.", 0) == 0) layer = std::stoll(p.name.substr(7));
    const bool draft = p.name.rfind("dspark.", 0) == 0 || layer >= c.num_hidden_layers;
    double used = n;  // what one token touches
    if (p.name.find(".ffn.experts.") != std::string::npos) {
      used = n * static_cast<double>(draft ? c.dspark_num_experts_per_tok : c.num_experts_per_tok) /
             static_cast<double>(draft ? c.dspark_n_routed_experts : c.n_routed_experts);
    } else if (p.name.find(".engram.table") != std::string::npos) {
      used =
          static_cast<double>((c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim);
    } else if (p.name == "embed.weight" || p.name == "dspark.markov.embed") {
      used = static_cast<double>(p.shape[1]);
    }
    if (draft) {
      a.drafter += used;
      continue;
    }
    a.total += n;
    const bool head = p.name == "head.weight";
    a.decode += used;
    if (!head) a.prefill_full += used;
    const bool compressor = p.name.find(".attn.compressor.") != std::string::npos ||
                            p.name.find(".attn.indexer.wk.") != std::string::npos ||
                            p.name.find(".attn.indexer.k_norm.") != std::string::npos ||
                            p.name.find(".attn_norm.") != std::string::npos;
    if (!head && (layer < E || (layer == E && compressor))) a.prefill_ced += used;
  }
  return a;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> EngramPrimes(const ModelConfig& c) {
  std::set<int64_t> seen;
  std::vector<std::vector<int64_t>> out;
  const int64_t orders = c.engram_max_ngram_size - 1;
  for (size_t slot = 0; slot < c.engram_layer_ids.size(); ++slot) {
    std::vector<int64_t> primes;
    int64_t sum = 0;
    for (int64_t o = 0; o < orders; ++o) {
      int64_t candidate = c.engram_vocab_size - 1;
      for (int64_t h = 0; h < c.engram_n_heads; ++h) {
        do {
          ++candidate;
        } while (!IsPrime(candidate) || seen.contains(candidate));
        seen.insert(candidate);
        primes.push_back(candidate);
        sum += candidate;
      }
    }
    if (sum != c.engram_num_embeddings[slot]) {
      return absl::InvalidArgumentError(
          absl::StrCat("engram_num_embeddings[", slot, "] is ", c.engram_num_embeddings[slot],
                       " but the primes of layer ", c.engram_layer_ids[slot], " sum to ", sum));
    }
    out.push_back(std::move(primes));
  }
  return out;
}

}  // namespace kvc::model
