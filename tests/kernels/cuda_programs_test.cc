// kvgen with --backend cuda, run as a user runs it, against --backend cpu on the same
// weights and prompt (fresh seeds): the logit dumps are identical bytes and the tokens the
// same; an exact resume on the GPU dumps the cold run's bytes; --backend cublas refuses
// exact replay with a one-line error. Skipped, saying so, where there is no GPU; the
// <test>_emu build runs kvgen built against the CPU emulation of CUDA (tests/cudaemu).
#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "kernels/kv_dequant.h"
#include "nlohmann/json.hpp"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cuda {
namespace {

using ::kvc::testing::RunProgram;

const std::string kKvgen = std::string(KVC_BIN_DIR) + "/kvgen";
const std::string kMini = std::string(KVC_SOURCE_DIR) + "/configs/mini.json";

class CudaProgramsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: kvgen --backend cuda cannot run here";
    const ModelConfig config = *LoadModelConfig(kMini);
    const uint64_t seed = testing::FreshSeed();
    ASSERT_TRUE(model::WriteRandomWeights(config, *BuildLayerSchedule(config), seed,
                                          dir_.File("w.safetensors"))
                    .ok());
    std::mt19937_64 rng(seed);
    std::ofstream p(dir_.File("prompt.txt"));
    for (int i = 0; i < 160; ++i) p << rng() % config.vocab_size << ' ';
  }
  testing::ProcessResult Kvgen(const std::string& backend, const std::string& dump,
                               std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"--config",
                                  kMini,
                                  "--weights",
                                  dir_.File("w.safetensors"),
                                  "--prompt",
                                  dir_.File("prompt.txt"),
                                  "--max-new-tokens",
                                  "4",
                                  "--greedy",
                                  "--chunk-tokens",
                                  "32",
                                  "--backend",
                                  backend,
                                  "--dump-logits",
                                  dir_.File(dump),
                                  "--json"};
    a.insert(a.end(), extra.begin(), extra.end());
    return RunProgram(kKvgen, a);
  }
  std::string Read(const std::string& name) {
    std::ifstream f(dir_.File(name), std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  testing::TempDir dir_;
};

TEST_F(CudaProgramsTest, KvgenOnTheGpuDumpsTheCpusLogitBytes) {
  const auto cpu = Kvgen("cpu", "cpu.bin");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const auto gpu = Kvgen("cuda", "cuda.bin");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  const nlohmann::json c = nlohmann::json::parse(cpu.out), g = nlohmann::json::parse(gpu.out);
  EXPECT_EQ(g["backend"], "cuda");
  EXPECT_EQ(g["attention_backend"], "cuda");
  EXPECT_EQ(g["indexer_backend"], "cuda");
  EXPECT_EQ(c["generated"], g["generated"]);
  const std::string a = Read("cpu.bin"), b = Read("cuda.bin");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the logit dumps differ (" << a.size() << " vs " << b.size() << " bytes)";

  const auto resumed = Kvgen("cuda", "resumed.bin", {"--resume-at", "128", "--replay", "exact"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(Read("resumed.bin") == b) << "exact resume on the GPU is not the cold run's bytes";
}

TEST_F(CudaProgramsTest, CublasRefusesExactReplayInOneLine) {
  const auto r = Kvgen("cublas", "x.bin", {"--resume-at", "128", "--replay", "exact"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("batch-invariant"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace kvc::cuda
