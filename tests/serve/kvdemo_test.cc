// kvdemo and kvserve run as users run them: real binaries, real kvcached, JSON out.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

using ::kvc::testing::Daemon;
using ::kvc::testing::RunProgram;
using ::kvc::testing::TempDir;

const std::string kBin = std::string(KVC_BIN_DIR);
const std::string kMini = std::string(KVC_SOURCE_DIR) + "/configs/mini.json";

TEST(KvdemoTest, ASessionResumesEveryTurnAndFromSsdAfterTheRestart) {
  const auto r = RunProgram(kBin + "/kvdemo", {"--json", "--turns", "3", "--initial-tokens", "1500",
                                               "--tool-tokens", "400", "--generate", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& turns = j["turns"];
  ASSERT_EQ(turns.size(), 3u);
  for (const nlohmann::json& t : turns) {
    for (const char* k : {"turn", "context_tokens", "reused_tokens", "new_tokens", "tier",
                          "ttft_warm_ms", "ttft_cold_ms", "after_restart"})
      ASSERT_TRUE(t.contains(k)) << k;
    EXPECT_EQ(t["context_tokens"].get<int>(),
              t["reused_tokens"].get<int>() + t["new_tokens"].get<int>());
    EXPECT_GT(t["ttft_cold_ms"].get<double>(), 0.0);
    EXPECT_TRUE(t["warnings"].empty()) << t["warnings"];
    EXPECT_TRUE(t["answer"].is_string()) << t;
  }
  EXPECT_EQ(turns[0]["reused_tokens"], 0);
  EXPECT_EQ(turns[0]["tier"], "none");
  // Turn 2 comes after the restart: everything reused is on SSD.
  EXPECT_TRUE(turns[1]["after_restart"].get<bool>());
  EXPECT_EQ(turns[1]["tier"], "ssd");
  EXPECT_GE(turns[1]["reused_tokens"].get<int>(), 1024);
  EXPECT_GT(turns[2]["reused_tokens"].get<int>(), turns[1]["reused_tokens"].get<int>());
  // Answers are sampled by default, with the documented defaults.
  EXPECT_EQ(j["sampling"]["temperature"], 0.8);
  EXPECT_EQ(j["sampling"]["top_p"], 0.95);
  EXPECT_EQ(j["sampling"]["seed"], 1);
  // The scratch folder is gone.
  EXPECT_EQ(r.out.find("kvdemo-"), std::string::npos);
}

TEST(KvdemoTest, OnAClusterAKilledNodeIsRoutedAroundAndTheSessionGoesOnAfterItsRestart) {
  const auto r =
      RunProgram(kBin + "/kvdemo", {"--json", "--nodes", "3", "--turns", "4", "--initial-tokens",
                                    "2048", "--tool-tokens", "600", "--generate", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& turns = j["turns"];
  ASSERT_EQ(turns.size(), 4u);
  // Turn 3: n1 was killed just before; its chunks come from their second copies.
  ASSERT_TRUE(turns[2]["after_restart"].get<bool>());
  const std::string killed_turn = turns[2]["nodes"];
  EXPECT_EQ(killed_turn.find("n1:"), std::string::npos) << killed_turn;
  EXPECT_GE(turns[2]["reused_tokens"].get<int>(), 2048);
  EXPECT_TRUE(turns[2]["warnings"].empty()) << turns[2]["warnings"];
  // Turn 4: n1 is back (its serving again is ClusterTest's; here which node ranks first
  // for this session's few chunks is fixed by its text) and the session goes on.
  EXPECT_GT(turns[3]["reused_tokens"].get<int>(), turns[2]["reused_tokens"].get<int>());
  int served = 0;  // "n0:5 n2:7": every reused chunk was served by some node
  const std::string back = turns[3]["nodes"];
  for (size_t at = back.find(':'); at != std::string::npos; at = back.find(':', at + 1)) {
    served += std::atoi(back.c_str() + at + 1);
  }
  EXPECT_EQ(served * j["chunk_tokens"].get<int>(), turns[3]["reused_tokens"].get<int>()) << back;
  for (const nlohmann::json& t : turns) EXPECT_TRUE(t["warnings"].empty()) << t["warnings"];
}

// With RADOS under the nodes, the whole fleet can be lost: halfway every node is killed and
// its folder deleted, and the session resumes from RADOS (then from the nodes' RAM).
TEST(KvdemoTest, WithRadosTheSessionOutlivesEveryNodeAndItsDisk) {
  const auto r = RunProgram(
      kBin + "/kvdemo", {"--json", "--rados", "--nodes", "3", "--turns", "4", "--initial-tokens",
                         "2048", "--tool-tokens", "600", "--generate", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["rados"].get<bool>());
  const nlohmann::json& turns = j["turns"];
  ASSERT_EQ(turns.size(), 4u);
  ASSERT_TRUE(turns[2]["after_restart"].get<bool>());
  EXPECT_EQ(turns[2]["tier"], "rados") << "no node kept anything";
  EXPECT_GE(turns[2]["reused_tokens"].get<int>(), 2048);
  EXPECT_GT(turns[3]["reused_tokens"].get<int>(), turns[2]["reused_tokens"].get<int>());
  // Turn 3 promoted the session into its owners' RAM: turn 4 is served from there, not
  // from a node that would read RADOS (every node can answer that it would).
  EXPECT_EQ(turns[3]["tier"], "ram");
  for (const nlohmann::json& t : turns) EXPECT_TRUE(t["warnings"].empty()) << t["warnings"];
}

TEST(KvserveTest, TurnsInSeparateProcessesResumeFromTheCache) {
  TempDir dir;
  Daemon d(dir.File("kvcached"));
  ASSERT_EQ(RunProgram(kBin + "/kvmodel", {"init", "--config", kMini, "--seed", "2", "--out",
                                           dir.File("w.safetensors")})
                .exit_code,
            0);
  auto turn = [&](const std::string& session, const std::string& text) {
    return RunProgram(kBin + "/kvserve", {"--cache", d.address(), "--config", kMini, "--weights",
                                          dir.File("w.safetensors"), "--state-dir",
                                          dir.File("state"), "--session", session, "--text", text,
                                          "--max-new-tokens", "8", "--replay", "exact", "--json"});
  };
  const std::string first(1300, 'a'), second = "run the tests and report";
  const auto a = turn("s1", first);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const nlohmann::json ja = nlohmann::json::parse(a.out);
  EXPECT_EQ(ja["reused_tokens"], 0);
  EXPECT_EQ(ja["context_tokens"], 1300);
  const auto b = turn("s1", second);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const nlohmann::json jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(jb["context_tokens"], 1300 + 8 + static_cast<int>(second.size()));
  EXPECT_EQ(jb["reused_tokens"], 1280);
  EXPECT_EQ(jb["tier"], "ram");
  EXPECT_TRUE(std::filesystem::exists(dir.File("state") + "/s1.tokens"));
  const auto bad = turn("../escape", "x");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("must be a plain name"), std::string::npos) << bad.err;
}

// --backend names where the matrix products run; a name that is not a backend, or a GPU
// one on a machine (or build) without a GPU, stops the program with one line.
TEST(KvdemoTest, ABackendThatIsNotThereIsOneClearError) {
  auto r = RunProgram(kBin + "/kvdemo", {"--backend", "tpu"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--backend is \"tpu\"; use cpu, cuda or cublas"), std::string::npos)
      << r.err;
  r = RunProgram(kBin + "/kvdemo", {"--backend", "cublas", "--replay", "exact"});
  EXPECT_EQ(r.exit_code, 1);
  // Without a GPU the backend cannot start; with one, exact replay is refused for cuBLAS.
  EXPECT_TRUE(r.err.find("no CUDA device") != std::string::npos ||
              r.err.find("without the CUDA backend") != std::string::npos ||
              r.err.find("needs a batch-invariant backend") != std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace kvc
