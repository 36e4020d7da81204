#include "engine/spec/model_config.h"

#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace kvc {
namespace {

using Json = nlohmann::json;

enum class Bound { kAny, kNonNegative, kPositive };

// Reads typed fields out of one JSON object. The first problem wins and every later read
// becomes a no-op, so the parser reads straight through and reports exactly one error
// that names the key (with its path) and the value it found.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string path, absl::Status* status)
      : object_(object), path_(std::move(path)), status_(status) {}

  const Json* Find(const char* key, bool required) {
    if (!status_->ok()) return nullptr;
    auto it = object_.find(key);
    if (it == object_.end()) {
      if (required) Fail(absl::StrCat("missing key \"", Name(key), "\""));
      return nullptr;
    }
    return &*it;
  }

  void Int(const char* key, int64_t* out, Bound bound, bool required = true) {
    const Json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_number_integer()) return WrongType(key, *v, "an integer");
    *out = v->get<int64_t>();
    CheckBound(key, static_cast<double>(*out), bound, v->dump());
  }

  void Double(const char* key, double* out, Bound bound, bool required = true) {
    const Json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_number()) return WrongType(key, *v, "a number");
    *out = v->get<double>();
    CheckBound(key, *out, bound, v->dump());
  }

  void Bool(const char* key, bool* out) {
    const Json* v = Find(key, true);
    if (v == nullptr) return;
    if (!v->is_boolean()) return WrongType(key, *v, "true or false");
    *out = v->get<bool>();
  }

  // A string that must be one of `allowed`.
  void Enum(const char* key, std::string* out, std::initializer_list<const char*> allowed,
            bool required = true) {
    const Json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_string()) return WrongType(key, *v, "a string");
    *out = v->get<std::string>();
    for (const char* a : allowed) {
      if (*out == a) return;
    }
    Fail(absl::StrCat("key \"", Name(key), "\" has unsupported value ", v->dump(),
                      " (supported: ", absl::StrJoin(allowed, ", "), ")"));
  }

  void String(const char* key, std::string* out, bool required = true) {
    const Json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_string()) return WrongType(key, *v, "a string");
    *out = v->get<std::string>();
  }

  void IntList(const char* key, std::vector<int64_t>* out, Bound bound) {
    const Json* v = Find(key, true);
    if (v == nullptr) return;
    if (!v->is_array()) return WrongType(key, *v, "an array of integers");
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      std::string item = absl::StrCat(key, "[", i, "]");
      if (!e.is_number_integer()) return WrongType(item.c_str(), e, "an integer");
      out->push_back(e.get<int64_t>());
      CheckBound(item.c_str(), static_cast<double>(out->back()), bound, e.dump());
      if (!status_->ok()) return;
    }
  }

  // Optional: an array of arrays of positive integers (absent: `out` stays empty).
  void OptionalIntLists(const char* key, std::vector<std::vector<int64_t>>* out) {
    const Json* v = Find(key, false);
    if (v == nullptr) return;
    if (!v->is_array()) return WrongType(key, *v, "an array of integer arrays");
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& row = (*v)[i];
      std::string item = absl::StrCat(key, "[", i, "]");
      if (!row.is_array()) return WrongType(item.c_str(), row, "an array of integers");
      out->emplace_back();
      for (size_t j = 0; j < row.size(); ++j) {
        std::string cell = absl::StrCat(item, "[", j, "]");
        if (!row[j].is_number_integer()) return WrongType(cell.c_str(), row[j], "an integer");
        out->back().push_back(row[j].get<int64_t>());
        CheckBound(cell.c_str(), static_cast<double>(out->back().back()), Bound::kPositive,
                   row[j].dump());
        if (!status_->ok()) return;
      }
    }
  }

  std::string Name(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  void Fail(const std::string& message) {
    if (status_->ok()) *status_ = absl::InvalidArgumentError(message);
  }

 private:
  void WrongType(const char* key, const Json& v, const char* expected) {
    Fail(absl::StrCat("key \"", Name(key), "\" must be ", expected, ", got ", v.dump()));
  }

  void CheckBound(const char* key, double value, Bound bound, const std::string& shown) {
    if (bound == Bound::kPositive && !(value > 0)) {
      Fail(absl::StrCat("key \"", Name(key), "\" must be positive, got ", shown));
    } else if (bound == Bound::kNonNegative && !(value >= 0)) {
      Fail(absl::StrCat("key \"", Name(key), "\" must be >= 0, got ", shown));
    }
  }

  const Json& object_;
  std::string path_;
  absl::Status* status_;
};

void ReadQuantization(const Json& root, ModelConfig* c, absl::Status* status) {
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return;
  if (!it->is_object()) {
    *status = absl::InvalidArgumentError(
        absl::StrCat("key \"quantization_config\" must be an object, got ", it->dump()));
    return;
  }
  FieldReader q(*it, "quantization_config", status);
  q.Enum("quant_method", &c->quant_method, {"fp8"});
  std::string activation_scheme;
  q.Enum("activation_scheme", &activation_scheme, {"dynamic"}, /*required=*/false);
  q.Enum("scale_fmt", &c->quant_scale_fmt, {"ue8m0"}, /*required=*/false);
  q.Enum("expert_dtype", &c->expert_dtype, {"fp4", "fp8"}, /*required=*/false);
  if (q.Find("weight_block_size", false) != nullptr) {
    q.IntList("weight_block_size", &c->weight_block_size, Bound::kPositive);
    if (status->ok() && c->weight_block_size.size() != 2) {
      q.Fail(absl::StrCat("key \"quantization_config.weight_block_size\" must have 2 entries, got ",
                          c->weight_block_size.size()));
    }
  }
}

void ReadRopeScaling(FieldReader& t, ModelConfig* c, absl::Status* status) {
  const Json* v = t.Find("rope_scaling", true);
  if (v == nullptr || v->is_null()) return;  // null: plain RoPE
  if (!v->is_object()) {
    t.Fail(absl::StrCat("key \"", t.Name("rope_scaling"), "\" must be an object or null, got ",
                        v->dump()));
    return;
  }
  FieldReader r(*v, t.Name("rope_scaling"), status);
  // Hugging Face writes "rope_type"; older configs write "type".
  r.Enum(v->contains("rope_type") ? "rope_type" : "type", &c->rope_scaling.type, {"yarn"});
  r.Double("factor", &c->rope_scaling.factor, Bound::kPositive);
  r.Double("beta_fast", &c->rope_scaling.beta_fast, Bound::kPositive);
  r.Double("beta_slow", &c->rope_scaling.beta_slow, Bound::kPositive);
  r.Int("original_max_position_embeddings", &c->rope_scaling.original_max_position_embeddings,
        Bound::kPositive);
}

}  // namespace

int64_t ModelConfig::activation_dtype_bytes() const {
  if (dtype == "float32") return 4;
  return 2;  // bfloat16, float16 (the only others the parser accepts)
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source) {
  // JSON lets a key appear twice in one object and keeps the last; a config where a
  // field is given twice is ambiguous (which one did its author mean?), so it is refused.
  std::vector<std::set<std::string>> keys_seen;
  std::string duplicate;
  const Json::parser_callback_t no_duplicates = [&](int, Json::parse_event_t event, Json& value) {
    if (event == Json::parse_event_t::object_start) {
      keys_seen.emplace_back();
    } else if (event == Json::parse_event_t::object_end && !keys_seen.empty()) {
      keys_seen.pop_back();
    } else if (event == Json::parse_event_t::key && !keys_seen.empty() &&
               !keys_seen.back().insert(value.get<std::string>()).second && duplicate.empty()) {
      duplicate = value.get<std::string>();
    }
    return true;
  };
  Json root = Json::parse(json_text, no_duplicates, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key \"", duplicate, "\" appears twice in one object"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": top level must be a JSON object"));
  }

  ModelConfig c;
  absl::Status status;
  FieldReader top(root, "", &status);
  // Hugging Face's newer name is "dtype", older exports use "torch_dtype".
  top.Enum(root.contains("torch_dtype") && !root.contains("dtype") ? "torch_dtype" : "dtype",
           &c.dtype, {"bfloat16", "float16", "float32"});
  top.Int("bos_token_id", &c.bos_token_id, Bound::kNonNegative);
  top.Int("eos_token_id", &c.eos_token_id, Bound::kNonNegative);
  top.Int("pad_token_id", &c.pad_token_id, Bound::kNonNegative);
  ReadQuantization(root, &c, &status);

  // The text model's keys live in "text_config" in the published (multimodal) config and
  // at the top level in a text-only one.
  const Json* text = &root;
  std::string path;
  if (auto it = root.find("text_config"); it != root.end()) {
    if (!it->is_object() && status.ok()) {
      status = absl::InvalidArgumentError(
          absl::StrCat("key \"text_config\" must be an object, got ", it->dump()));
    }
    text = &*it;
    path = "text_config";
  }
  if (status.ok()) {
    FieldReader t(*text, path, &status);
    t.String("model_type", &c.model_type, /*required=*/false);
    t.Int("vocab_size", &c.vocab_size, Bound::kPositive);
    t.Int("hidden_size", &c.hidden_size, Bound::kPositive);
    t.Int("num_hidden_layers", &c.num_hidden_layers, Bound::kPositive);
    t.Int("num_attention_heads", &c.num_attention_heads, Bound::kPositive);
    t.Int("num_key_value_heads", &c.num_key_value_heads, Bound::kPositive);
    t.Int("head_dim", &c.head_dim, Bound::kPositive);
    t.Int("qk_rope_head_dim", &c.qk_rope_head_dim, Bound::kPositive);
    t.Int("q_lora_rank", &c.q_lora_rank, Bound::kPositive);
    t.Int("o_lora_rank", &c.o_lora_rank, Bound::kPositive);
    t.Int("o_groups", &c.o_groups, Bound::kPositive);
    t.Enum("hidden_act", &c.hidden_act, {"silu"});
    t.Double("swiglu_limit", &c.swiglu_limit, Bound::kPositive);
    t.Double("rms_norm_eps", &c.rms_norm_eps, Bound::kPositive);
    t.Int("max_position_embeddings", &c.max_position_embeddings, Bound::kPositive);
    t.Double("rope_theta", &c.rope_theta, Bound::kPositive);
    ReadRopeScaling(t, &c, &status);

    t.Int("moe_intermediate_size", &c.moe_intermediate_size, Bound::kPositive);
    t.Int("n_routed_experts", &c.n_routed_experts, Bound::kPositive);
    t.Int("n_shared_experts", &c.n_shared_experts, Bound::kNonNegative);
    t.Int("num_experts_per_tok", &c.num_experts_per_tok, Bound::kPositive);
    t.Enum("scoring_func", &c.scoring_func, {"sqrtsoftplus"});
    t.Enum("topk_method", &c.topk_method, {"noaux_tc"});
    t.Bool("norm_topk_prob", &c.norm_topk_prob);
    t.Double("routed_scaling_factor", &c.routed_scaling_factor, Bound::kPositive);

    t.Int("sliding_window", &c.sliding_window, Bound::kPositive);
    t.IntList("compress_ratios", &c.compress_ratios, Bound::kNonNegative);
    t.Double("compress_rope_theta", &c.compress_rope_theta, Bound::kPositive);
    t.IntList("kv_source_layer_ids", &c.kv_source_layer_ids, Bound::kNonNegative);
    t.IntList("index_source_layer_ids", &c.index_source_layer_ids, Bound::kNonNegative);
    t.Int("index_n_heads", &c.index_n_heads, Bound::kPositive);
    t.Int("index_head_dim", &c.index_head_dim, Bound::kPositive);
    t.Int("index_topk", &c.index_topk, Bound::kPositive);
    t.Int("candidate_source_layer_id", &c.candidate_source_layer_id, Bound::kNonNegative);
    t.Int("candidate_topk_blocks", &c.candidate_topk_blocks, Bound::kPositive);
    t.Int("candidate_block_size", &c.candidate_block_size, Bound::kPositive);

    t.Int("hc_mult", &c.hc_mult, Bound::kPositive);
    t.Int("hc_sinkhorn_iters", &c.hc_sinkhorn_iters, Bound::kPositive);
    t.Double("hc_eps", &c.hc_eps, Bound::kPositive);

    t.IntList("engram_layer_ids", &c.engram_layer_ids, Bound::kNonNegative);
    t.IntList("engram_num_embeddings", &c.engram_num_embeddings, Bound::kPositive);
    t.Int("engram_max_ngram_size", &c.engram_max_ngram_size, Bound::kPositive);
    t.Int("engram_vocab_size", &c.engram_vocab_size, Bound::kPositive);
    t.Int("engram_n_heads", &c.engram_n_heads, Bound::kPositive);
    t.Int("engram_head_dim", &c.engram_head_dim, Bound::kPositive);
    t.Int("engram_pad_token_id", &c.engram_pad_token_id, Bound::kNonNegative);
    t.Int("engram_compressed_vocab_size", &c.engram_compressed_vocab_size, Bound::kPositive);
    t.OptionalIntLists("engram_multipliers", &c.engram_multipliers);

    t.Int("num_nextn_predict_layers", &c.num_nextn_predict_layers, Bound::kNonNegative);
    t.Int("dspark_block_size", &c.dspark_block_size, Bound::kPositive);
    t.Int("dspark_noise_token_id", &c.dspark_noise_token_id, Bound::kNonNegative);
    t.IntList("dspark_target_layer_ids", &c.dspark_target_layer_ids, Bound::kNonNegative);
    t.Int("dspark_markov_rank", &c.dspark_markov_rank, Bound::kPositive);
    t.Int("dspark_n_routed_experts", &c.dspark_n_routed_experts, Bound::kPositive);
    t.Int("dspark_num_experts_per_tok", &c.dspark_num_experts_per_tok, Bound::kPositive);

    if (status.ok() && c.engram_num_embeddings.size() != c.engram_layer_ids.size()) {
      t.Fail(absl::StrCat("key \"", t.Name("engram_num_embeddings"), "\" has ",
                          c.engram_num_embeddings.size(), " entries but \"",
                          t.Name("engram_layer_ids"), "\" has ", c.engram_layer_ids.size()));
    }
    if (status.ok() && !c.engram_multipliers.empty()) {
      if (c.engram_multipliers.size() != c.engram_layer_ids.size()) {
        t.Fail(absl::StrCat("key \"", t.Name("engram_multipliers"), "\" has ",
                            c.engram_multipliers.size(), " rows but \"", t.Name("engram_layer_ids"),
                            "\" has ", c.engram_layer_ids.size()));
      }
      for (size_t i = 0; status.ok() && i < c.engram_multipliers.size(); ++i) {
        if (static_cast<int64_t>(c.engram_multipliers[i].size()) != c.engram_max_ngram_size) {
          t.Fail(absl::StrCat("key \"", t.Name("engram_multipliers"), "\" row ", i, " has ",
                              c.engram_multipliers[i].size(), " entries; engram_max_ngram_size is ",
                              c.engram_max_ngram_size));
        }
      }
    }
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", status.message()));
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model config \"", path, "\""));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read model config \"", path, "\""));
  return ParseModelConfig(text.str(), path);
}

}  // namespace kvc
