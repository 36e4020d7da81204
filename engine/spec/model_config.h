// ModelConfig: the DeepSeek V4.1 Flash architecture as described by a Hugging Face
// config.json (nested `text_config`, or the same keys at the top level).
//
// Parsing checks every key the project uses: a missing key, a wrong JSON type, a
// non-positive size or an unknown enum/dtype value is an InvalidArgument status whose
// message names the key and the value. Cross-key rules (layer ids, compress ratios,
// Full/Reindex/Reuse sources) are checked when the schedule is built
// (layer_schedule.h), so both the parser and the schedule report precise errors.
//
// Thread-safety: a plain value type; immutable after parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kvc {

struct RopeScaling {
  std::string type;  // "yarn" is the only one the architecture uses
  double factor = 1.0;
  double beta_fast = 0.0;
  double beta_slow = 0.0;
  int64_t original_max_position_embeddings = 0;
};

struct ModelConfig {
  // Identity and dtypes.
  std::string model_type;  // "deepseek_v41_text" for the reference
  std::string dtype;       // activation / dense-weight dtype: bfloat16, float16 or float32
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 0;
  int64_t pad_token_id = 0;

  // Weight quantization (optional in the file; empty quant_method when absent).
  std::string quant_method;     // "fp8"
  std::string quant_scale_fmt;  // "ue8m0"
  std::string expert_dtype;     // "fp4" or "fp8"
  std::vector<int64_t> weight_block_size;

  // Trunk.
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;  // encoder + decoder; draft layers come on top
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int64_t o_groups = 0;
  std::string hidden_act;
  double swiglu_limit = 0.0;
  double rms_norm_eps = 0.0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 0.0;
  RopeScaling rope_scaling;

  // MoE.
  int64_t moe_intermediate_size = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  std::string scoring_func;
  std::string topk_method;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 0.0;

  // CSA2 attention and its global KV.
  int64_t sliding_window = 0;
  std::vector<int64_t> compress_ratios;  // one per layer, draft layers included
  double compress_rope_theta = 0.0;
  std::vector<int64_t> kv_source_layer_ids;     // Full layers
  std::vector<int64_t> index_source_layer_ids;  // Full + Reindex layers
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t candidate_source_layer_id = 0;
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;

  // Hyper-connections.
  int64_t hc_mult = 0;
  int64_t hc_sinkhorn_iters = 0;
  double hc_eps = 0.0;

  // Engram.
  std::vector<int64_t> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int64_t engram_max_ngram_size = 0;
  int64_t engram_vocab_size = 0;
  int64_t engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  int64_t engram_pad_token_id = 0;
  int64_t engram_compressed_vocab_size = 0;
  // Optional: the odd n-gram hash multipliers per Engram layer (engram_max_ngram_size each).
  // The reference derives them with numpy's PCG64 (seed 10007 × layer id); small configs
  // carry them here (scripts/engram_multipliers.py prints them).
  std::vector<std::vector<int64_t>> engram_multipliers;

  // DSpark drafter.
  int64_t num_nextn_predict_layers = 0;
  int64_t dspark_block_size = 0;
  int64_t dspark_noise_token_id = 0;
  std::vector<int64_t> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 0;
  int64_t dspark_n_routed_experts = 0;
  int64_t dspark_num_experts_per_tok = 0;

  // Layers in the schedule: trunk plus draft.
  int64_t total_layers() const { return num_hidden_layers + num_nextn_predict_layers; }
  // Bytes of one activation element in `dtype` (2 for bfloat16).
  int64_t activation_dtype_bytes() const;
};

// Parses config.json text. `source` names the input in error messages (a path).
[[nodiscard]] absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                                           absl::string_view source = "config");

// Reads and parses a config.json file.
[[nodiscard]] absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace kvc
