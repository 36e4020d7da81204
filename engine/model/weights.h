// The parameters of a V4.1 Flash trunk, by tensor name, shape and role, from the config.
//
// Names follow the reference's module paths where practical (docs/model.md lists them):
//   embed.weight [V, D]; norm.weight [D]; head.weight [V, D]
//   layers.L.{attn_norm,ffn_norm}.weight [D]
//   layers.L.hc_{attn,ffn}_{fn [24, 4D], base [24], scale [3]}       (hc_mult 4)
//   layers.L.attn.{wq_a [q_lora, D], q_norm [q_lora], wq_b [H·hd, q_lora], wkv [hd, D],
//                  kv_norm [hd], attn_sink [H], wo_a [G·o_lora, H·hd/G], wo_b [D, G·o_lora]}
//   Full layers:   attn.compressor.{wkv [hd, D], wgate [hd, D] (ratio 2), norm [hd]}
//                  attn.indexer.{wk [Id, hd], k_norm [Id]}
//   Full+Reindex:  attn.indexer.{wq_b [IH·Id, q_lora], weights_proj [IH, D]}
//   layers.L.ffn.gate.{weight [E, D], bias [E]};
//   layers.L.ffn.experts.e.{w1,w3 [I, D], w2 [D, I]}; layers.L.ffn.shared_experts.{w1,w3,w2}
//   Engram layers: layers.L.engram.{table [rows, engram_head_dim],
//                  wkv [(hc+1)·D, orders·heads·engram_head_dim], qw [hc, D], kw [hc, D]}
//   DSpark: dspark.{main_proj [D, targets·D], main_norm [D], norm [D],
//           markov.embed [V, rank], markov.head [V, rank]}; draft layers L ≥ num_hidden_layers
//           carry the SWA-only attention, hc and norm tensors above and an MoE of
//           dspark_n_routed_experts experts.
// All float32 in the file (BF16 is accepted and widened).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/safetensors.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"

namespace kvc::model {

// How kvmodel init fills a tensor (deterministic from the seed and the tensor's name).
enum class InitKind {
  kLinear,     // uniform, std 1/sqrt(in)
  kOutLinear,  // a residual branch's last projection: std 1/sqrt(in · 2 · layers)
  kEmbedding,  // std 1
  kNorm,       // 1 ± 0.1
  kSmall,      // std 0.1 (gate bias, engram q/k weights around 1 come from kNorm)
  kSink,       // std 0.5
  kHcFn,       // std 0.1/sqrt(4D): mixes start near their biases
  kHcBase,     // pre 0, post 0, comb 4·identity (near-identity Sinkhorn)
  kHcScale,    // 1
  kTable,      // std 1
};

struct ParameterSpec {
  std::string name;
  std::vector<int64_t> shape;
  InitKind init = InitKind::kLinear;
};

// Every tensor the model needs (trunk, then DSpark), in a fixed order.
std::vector<ParameterSpec> ModelParameters(const ModelConfig& config,
                                           const LayerSchedule& schedule);

// Parameters one token touches, from the tensor list: routed experts count k of E, an
// Engram table the rows its hashes pick, the embedding one row, the output head only where
// logits are computed (every decode step; the last prefill position, ≈ 0 per token).
// CED prefill runs the encoder and the decoder's compressor for every token; the rest of
// the decoder runs on one window, ≈ 0 per token of a long prompt. The DSpark drafter is
// counted apart.
struct ActiveParameters {
  double total = 0;         // every trunk parameter (Engram tables included)
  double decode = 0;        // per decode token
  double prefill_ced = 0;   // per prompt token, CED prefill
  double prefill_full = 0;  // per prompt token, full-depth prefill
  double drafter = 0;       // DSpark per drafted block row
};
ActiveParameters CountActiveParameters(const ModelConfig& config, const LayerSchedule& schedule);

// Writes deterministic random weights for `config` (same config + seed: same bytes).
absl::Status WriteRandomWeights(const ModelConfig& config, const LayerSchedule& schedule,
                                uint64_t seed, const std::string& path);

// Engram row offsets: primes per (order, head) starting above engram_vocab_size − 1, each
// the next prime not used by any earlier layer / order / head; per layer their sum must
// equal engram_num_embeddings. primes[layer_slot][order·heads + head].
absl::StatusOr<std::vector<std::vector<int64_t>>> EngramPrimes(const ModelConfig& config);

}  // namespace kvc::model
