#include "engine/spec/model_config.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/engine/spec/config_fixtures.h"

namespace kvc {
namespace {

using ::kvc::testing::kMiniConfig;
using ::kvc::testing::kReferenceConfig;
using ::kvc::testing::LoadJson;
using Json = nlohmann::json;

// Parses `j` and expects InvalidArgument whose message contains every one of `needles`.
void ExpectRejected(const Json& j, std::initializer_list<std::string> needles) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(j.dump(), "cfg.json");
  ASSERT_FALSE(c.ok()) << "accepted: " << j.dump().substr(0, 200);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(c.status().message());
  EXPECT_NE(message.find("cfg.json"), std::string::npos) << message;
  for (const std::string& n : needles) {
    EXPECT_NE(message.find(n), std::string::npos) << "\"" << n << "\" not in: " << message;
  }
}

TEST(ModelConfigTest, ParsesPublishedReferenceConfig) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(kReferenceConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  // Compare against the JSON itself rather than typed-in numbers.
  const Json t = LoadJson(kReferenceConfig())["text_config"];
  EXPECT_EQ(c->num_hidden_layers, t["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(c->head_dim, t["head_dim"].get<int64_t>());
  EXPECT_EQ(c->index_head_dim, t["index_head_dim"].get<int64_t>());
  EXPECT_EQ(c->compress_ratios, t["compress_ratios"].get<std::vector<int64_t>>());
  EXPECT_EQ(c->kv_source_layer_ids, t["kv_source_layer_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(c->index_source_layer_ids, t["index_source_layer_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(c->sliding_window, t["sliding_window"].get<int64_t>());
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings,
            t["rope_scaling"]["original_max_position_embeddings"].get<int64_t>());
  EXPECT_DOUBLE_EQ(c->hc_eps, t["hc_eps"].get<double>());
  EXPECT_EQ(c->dspark_target_layer_ids, t["dspark_target_layer_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(c->total_layers(),
            t["num_hidden_layers"].get<int64_t>() + t["num_nextn_predict_layers"].get<int64_t>());
  EXPECT_EQ(c->dtype, "bfloat16");
  EXPECT_EQ(c->activation_dtype_bytes(), 2);
  EXPECT_EQ(c->quant_method, "fp8");
  EXPECT_EQ(c->expert_dtype, "fp4");
}

// configs/reference-shaped.json (the GPU check's speed runs): the reference's layers at
// their own sizes — every per-layer dimension, the experts each token reaches — in a
// 4-layer schedule, with only as many experts as a token uses and a 16K vocabulary.
TEST(ModelConfigTest, ReferenceShapedConfigHasTheReferencesLayerShapes) {
  absl::StatusOr<ModelConfig> ref = LoadModelConfig(kReferenceConfig());
  absl::StatusOr<ModelConfig> c =
      LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/reference-shaped.json");
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_TRUE(c.ok()) << c.status();
  const std::pair<const char*, int64_t ModelConfig::*> same[] = {
      {"hidden_size", &ModelConfig::hidden_size},
      {"num_attention_heads", &ModelConfig::num_attention_heads},
      {"head_dim", &ModelConfig::head_dim},
      {"qk_rope_head_dim", &ModelConfig::qk_rope_head_dim},
      {"q_lora_rank", &ModelConfig::q_lora_rank},
      {"o_lora_rank", &ModelConfig::o_lora_rank},
      {"o_groups", &ModelConfig::o_groups},
      {"moe_intermediate_size", &ModelConfig::moe_intermediate_size},
      {"num_experts_per_tok", &ModelConfig::num_experts_per_tok},
      {"n_shared_experts", &ModelConfig::n_shared_experts},
      {"sliding_window", &ModelConfig::sliding_window},
      {"index_n_heads", &ModelConfig::index_n_heads},
      {"index_head_dim", &ModelConfig::index_head_dim},
      {"index_topk", &ModelConfig::index_topk},
      {"candidate_topk_blocks", &ModelConfig::candidate_topk_blocks},
      {"candidate_block_size", &ModelConfig::candidate_block_size},
      {"hc_mult", &ModelConfig::hc_mult},
      {"hc_sinkhorn_iters", &ModelConfig::hc_sinkhorn_iters},
      {"engram_n_heads", &ModelConfig::engram_n_heads},
      {"engram_head_dim", &ModelConfig::engram_head_dim},
      {"engram_max_ngram_size", &ModelConfig::engram_max_ngram_size},
      {"dspark_markov_rank", &ModelConfig::dspark_markov_rank},
      {"dspark_num_experts_per_tok", &ModelConfig::dspark_num_experts_per_tok},
  };
  for (const auto& [name, field] : same) EXPECT_EQ((*c).*field, (*ref).*field) << name;
  EXPECT_EQ(c->n_routed_experts, c->num_experts_per_tok);
  EXPECT_EQ(c->dspark_n_routed_experts, c->dspark_num_experts_per_tok);
  EXPECT_EQ(c->num_hidden_layers, 4);
  EXPECT_LT(c->dspark_noise_token_id, c->vocab_size);
}

TEST(ModelConfigTest, ParsesMiniConfig) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(kMiniConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LT(c->hidden_size, 1024);
  EXPECT_GE(c->num_nextn_predict_layers, 1);
}

TEST(ModelConfigTest, AcceptsFlatTextOnlyConfig) {
  Json j = LoadJson(kReferenceConfig());
  Json flat = j["text_config"];
  flat["dtype"] = j["dtype"];
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) flat[k] = j[k];
  absl::StatusOr<ModelConfig> c = ParseModelConfig(flat.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_hidden_layers, j["text_config"]["num_hidden_layers"].get<int64_t>());
}

TEST(ModelConfigTest, EveryMissingKeyIsNamed) {
  const Json base = LoadJson(kReferenceConfig());
  int checked = 0;
  for (const auto& [key, value] : base["text_config"].items()) {
    if (key == "model_type" || key == "attention_bias") continue;  // not used, optional
    Json j = base;
    j["text_config"].erase(key);
    ExpectRejected(j, {"missing key", "text_config." + key});
    ++checked;
  }
  EXPECT_GT(checked, 50);
  Json j = base;
  j.erase("dtype");
  ExpectRejected(j, {"missing key", "\"dtype\""});
}

TEST(ModelConfigTest, WrongTypesAreNamedWithValue) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["head_dim"] = "512";
  ExpectRejected(j, {"text_config.head_dim", "integer", "\"512\""});

  j = LoadJson(kReferenceConfig());
  j["text_config"]["compress_ratios"][7] = 1.5;
  ExpectRejected(j, {"compress_ratios[7]", "1.5"});

  j = LoadJson(kReferenceConfig());
  j["text_config"]["kv_source_layer_ids"] = 2;
  ExpectRejected(j, {"kv_source_layer_ids", "array"});

  j = LoadJson(kReferenceConfig());
  j["text_config"]["norm_topk_prob"] = 1;
  ExpectRejected(j, {"norm_topk_prob", "true or false"});

  j = LoadJson(kReferenceConfig());
  j["text_config"] = 3;
  ExpectRejected(j, {"text_config", "object"});
}

TEST(ModelConfigTest, NonPositiveSizesAreRejected) {
  for (const char* key : {"head_dim", "index_head_dim", "sliding_window", "hidden_size",
                          "num_hidden_layers", "candidate_block_size", "index_topk"}) {
    for (int value : {0, -4}) {
      Json j = LoadJson(kReferenceConfig());
      j["text_config"][key] = value;
      ExpectRejected(j, {std::string("text_config.") + key, "positive", std::to_string(value)});
    }
  }
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["compress_ratios"][3] = -2;
  ExpectRejected(j, {"compress_ratios[3]", "-2"});
  j = LoadJson(kReferenceConfig());
  j["text_config"]["rope_scaling"]["factor"] = 0;
  ExpectRejected(j, {"rope_scaling.factor", "positive"});
}

TEST(ModelConfigTest, UnknownDtypesAndEnumsAreRejected) {
  Json j = LoadJson(kReferenceConfig());
  j["dtype"] = "float8";
  ExpectRejected(j, {"dtype", "\"float8\"", "bfloat16"});

  j = LoadJson(kReferenceConfig());
  j["quantization_config"]["expert_dtype"] = "int4";
  ExpectRejected(j, {"quantization_config.expert_dtype", "\"int4\""});

  j = LoadJson(kReferenceConfig());
  j["quantization_config"]["quant_method"] = "awq";
  ExpectRejected(j, {"quantization_config.quant_method", "\"awq\""});

  j = LoadJson(kReferenceConfig());
  j["text_config"]["scoring_func"] = "softmax";
  ExpectRejected(j, {"text_config.scoring_func", "\"softmax\"", "sqrtsoftplus"});

  j = LoadJson(kReferenceConfig());
  j["text_config"]["rope_scaling"]["rope_type"] = "linear";
  ExpectRejected(j, {"rope_scaling.rope_type", "\"linear\""});
}

TEST(ModelConfigTest, MismatchedEngramListsAreRejected) {
  Json j = LoadJson(kReferenceConfig());
  j["text_config"]["engram_num_embeddings"].push_back(5);
  ExpectRejected(j, {"engram_num_embeddings", "3 entries", "engram_layer_ids", "2"});
}

TEST(ModelConfigTest, AKeyGivenTwiceIsRefusedNamingIt) {
  // The reference config with one field repeated (inner object) — JSON parsers keep the
  // last value, so which one its author meant is unknown.
  std::string text = LoadJson(kReferenceConfig()).dump();
  const size_t at = text.find("\"vocab_size\"");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"vocab_size\": 7, ");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text, "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("cfg.json: key \"vocab_size\" appears twice"),
            std::string::npos)
      << c.status();
  // The same key in two different objects is fine.
  EXPECT_TRUE(ParseModelConfig(LoadJson(kReferenceConfig()).dump(), "cfg.json").ok());
}

TEST(ModelConfigTest, GarbageInputIsAnErrorNotACrash) {
  for (const char* text : {"", "{", "[1,2,3]", "null", "{\"text_config\": {}}", "\xff\xfe"}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(text, "cfg.json");
    EXPECT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  }
  absl::StatusOr<ModelConfig> missing = LoadModelConfig("/nonexistent/config.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/config.json"), std::string::npos);
}

}  // namespace
}  // namespace kvc
