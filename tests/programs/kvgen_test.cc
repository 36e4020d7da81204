// kvmodel and kvgen run as a user runs them: weights written by kvmodel, prompts from
// files, one JSON object out, one-line errors with a non-zero exit.
#include <fstream>
#include <random>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

using ::kvc::testing::RunProgram;
using ::kvc::testing::TempDir;

const std::string kKvgen = std::string(KVC_BIN_DIR) + "/kvgen";
const std::string kKvmodel = std::string(KVC_BIN_DIR) + "/kvmodel";
const std::string kMini = std::string(KVC_SOURCE_DIR) + "/configs/mini.json";

class KvgenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto r = RunProgram(
        kKvmodel, {"init", "--config", kMini, "--seed", "3", "--out", dir_.File("w.safetensors")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::mt19937_64 rng(testing::FreshSeed());
    std::ofstream p(dir_.File("prompt.txt"));
    for (int i = 0; i < 300; ++i) p << rng() % 512 << (i % 20 == 19 ? "\n" : " ");
  }
  std::vector<std::string> Args(std::vector<std::string> extra) {
    std::vector<std::string> a = {"--config",  kMini,
                                  "--weights", dir_.File("w.safetensors"),
                                  "--prompt",  dir_.File("prompt.txt"),
                                  "--json"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  TempDir dir_;
};

TEST_F(KvgenTest, ResumeExactMatchesColdAndReportsTheWork) {
  const auto cold = RunProgram(
      kKvgen, Args({"--max-new-tokens", "6", "--greedy", "--dump-logits", dir_.File("cold.bin")}));
  ASSERT_EQ(cold.exit_code, 0) << cold.err;
  const auto warm =
      RunProgram(kKvgen, Args({"--max-new-tokens", "6", "--greedy", "--resume-at", "256",
                               "--replay", "exact", "--dump-logits", dir_.File("warm.bin")}));
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  const nlohmann::json c = nlohmann::json::parse(cold.out), w = nlohmann::json::parse(warm.out);
  EXPECT_EQ(c["generated"], w["generated"]);
  EXPECT_EQ(c["generated"].size(), 6u);
  EXPECT_EQ(c["prefill_tokens_computed"]["encoder"], 300);
  const nlohmann::json t = nlohmann::json::parse(std::ifstream(kMini))["text_config"];
  const int win = t["sliding_window"], encoder = t["num_hidden_layers"].get<int>() / 2;
  EXPECT_EQ(c["prefill_tokens_computed"]["decoder"], win);  // one sliding window
  // Exact replay: the encoder's dependency window before the first position the decoder
  // reads (the cached prefix's end here, as more than a window of tokens is new).
  EXPECT_EQ(w["replayed_tokens"], encoder * win);
  EXPECT_LT(w["prefill_tokens_computed"]["encoder"].get<int>(), 300);
  EXPECT_GT(c["ttft_ms"].get<double>(), 0.0);
  std::ifstream a(dir_.File("cold.bin"), std::ios::binary),
      b(dir_.File("warm.bin"), std::ios::binary);
  std::stringstream sa, sb;
  sa << a.rdbuf();
  sb << b.rdbuf();
  EXPECT_EQ(sa.str().size(), 6u * 512 * sizeof(float));
  EXPECT_EQ(sa.str(), sb.str()) << "exact resume logits differ from the cold run";
  const auto spec = RunProgram(kKvgen, Args({"--max-new-tokens", "6", "--greedy", "--dspark"}));
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(nlohmann::json::parse(spec.out)["generated"], c["generated"]);
}

// A text prompt runs as its byte tokens, and the continuation comes back decoded: the
// same tokens as the ids of that text given with --prompt, and "text" their bytes.
TEST_F(KvgenTest, ATextPromptRunsAsByteTokensAndPrintsTheContinuation) {
  const std::string text = "int main(int argc, char** argv) {\n  return";
  std::ofstream(dir_.File("prompt.c")) << text;
  std::ofstream ids(dir_.File("ids.txt"));
  for (unsigned char b : text) ids << 3 + b << " ";
  ids.close();
  auto run = [&](const std::string& flag, const std::string& file) {
    const auto r =
        RunProgram(kKvgen, {"--config", kMini, "--weights", dir_.File("w.safetensors"), flag,
                            dir_.File(file), "--max-new-tokens", "8", "--greedy", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json as_text = run("--text-file", "prompt.c");
  const nlohmann::json as_ids = run("--prompt", "ids.txt");
  EXPECT_EQ(as_text["prompt_tokens"], text.size());
  EXPECT_EQ(as_text["generated"], as_ids["generated"]);
  EXPECT_FALSE(as_ids.contains("text"));
  std::string want;
  for (uint32_t t : as_text["generated"].get<std::vector<uint32_t>>()) {
    if (t >= 3 && t < 259) want.push_back(static_cast<char>(t - 3));
  }
  // Bytes that are not UTF-8 print as U+FFFD; the rest as they are.
  const std::string replaced =
      nlohmann::json::parse(
          nlohmann::json(want).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
          .get<std::string>();
  EXPECT_EQ(as_text["text"].get<std::string>(), replaced);
}

// Sampling: the same seed gives the same tokens, another seed others, --greedy the argmax
// (= --temperature 0), and a tiny nucleus the argmax at any temperature.
TEST_F(KvgenTest, SamplingIsSeededAndGreedyIsTheTinyNucleus) {
  auto run = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--max-new-tokens", "24"});
    const auto r = RunProgram(kKvgen, Args(extra));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  std::mt19937_64 rng(testing::FreshSeed());
  const std::string seed = std::to_string(rng() % 1000000);
  const nlohmann::json a = run({"--temperature", "1.2", "--seed", seed});
  const nlohmann::json b = run({"--temperature", "1.2", "--seed", seed});
  const nlohmann::json c = run({"--temperature", "1.2", "--seed", seed + "1"});
  EXPECT_EQ(a["generated"], b["generated"]);
  EXPECT_NE(a["generated"], c["generated"]);
  EXPECT_EQ(a["sampling"]["temperature"], 1.2);
  const nlohmann::json greedy = run({"--greedy"});
  EXPECT_EQ(greedy["sampling"]["temperature"], 0.0);
  EXPECT_EQ(run({"--temperature", "0"})["generated"], greedy["generated"]);
  EXPECT_EQ(run({"--top-p", "0.000001", "--seed", seed})["generated"], greedy["generated"]);
}

TEST_F(KvgenTest, BadInputGivesOneLineErrors) {
  auto expect = [&](std::vector<std::string> args, int code, const std::string& text) {
    const auto r = RunProgram(kKvgen, args);
    EXPECT_EQ(r.exit_code, code) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  expect(Args({"--resume-at", "100"}), 1, "must be a multiple of the chunk size 256");
  expect(Args({"--resume-at", "512"}), 1, "shorter than the prompt (300 tokens)");
  expect(Args({"--resume-at", "256", "--replay", "sometimes"}), 1, "--replay is \"sometimes\"");
  expect(Args({"--dspark"}), 2, "--dspark needs --greedy");
  expect(Args({"--temperature", "-1"}), 2, "--temperature");
  expect(Args({"--top-p", "1.5"}), 2, "--top-p");
  expect(Args({"--backend", "tpu"}), 1, "--backend is \"tpu\"; use cpu, cuda or cublas");
  expect({"--config", kMini}, 2, "required");
  expect({"--config", kMini, "--weights", dir_.File("w.safetensors"), "--prompt",
          dir_.File("prompt.txt"), "--text-file", dir_.File("prompt.txt")},
         2, "Exactly 1 option from [--prompt,--text-file]");
  std::ofstream(dir_.File("oov.txt")) << "1 2 3 512 4";
  expect({"--config", kMini, "--weights", dir_.File("w.safetensors"), "--prompt",
          dir_.File("oov.txt")},
         1, "prompt token 3 is 512, outside the vocabulary of 512");
  std::ofstream(dir_.File("words.txt")) << "1 2 three";
  expect({"--config", kMini, "--weights", dir_.File("w.safetensors"), "--prompt",
          dir_.File("words.txt")},
         1, "token 2 is \"three\", not a token id");
  expect({"--config", std::string(KVC_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.config.json",
          "--weights", dir_.File("w.safetensors"), "--prompt", dir_.File("prompt.txt")},
         1, "is not part of this config's model");
}

}  // namespace
}  // namespace kvc
