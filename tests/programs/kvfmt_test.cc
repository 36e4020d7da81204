// kvfmt run as a user runs it: real files in, real files out, exit codes and messages.
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "engine/spec/kv_codec.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

using ::kvc::testing::RunProgram;
using ::kvc::testing::TempDir;

const std::string kKvfmt = std::string(KVC_BIN_DIR) + "/kvfmt";
const std::string kConfig =
    std::string(KVC_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.config.json";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void Write(const std::string& path, const void* data, size_t n) {
  std::ofstream(path, std::ios::binary)
      .write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

TEST(KvfmtTest, QuantizeThenDequantizeEqualsLibraryQat) {
  std::mt19937_64 rng(testing::FreshSeed());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  TempDir dir;
  for (const char* format : {"main", "index", "swa"}) {
    KvFormat f;
    ASSERT_TRUE(ParseKvFormat(format, &f).ok());
    const int64_t dim = f == KvFormat::kIndexK ? 128 : 512;  // the reference config's dims
    const int64_t rows = 7;
    std::vector<float> x(rows * dim);
    for (float& v : x) v = normal(rng);
    Write(dir.File("in.f32"), x.data(), x.size() * 4);
    auto q = RunProgram(kKvfmt, {"quantize", "--format", format, "--in", dir.File("in.f32"),
                                 "--out", dir.File("packed"), "--config", kConfig});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    EXPECT_EQ(static_cast<int64_t>(Slurp(dir.File("packed")).size()), rows * PackedBytes(f, dim));
    auto d = RunProgram(kKvfmt, {"dequantize", "--format", format, "--in", dir.File("packed"),
                                 "--out", dir.File("out.f32"), "--dim", std::to_string(dim)});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    const std::string out = Slurp(dir.File("out.f32"));
    ASSERT_EQ(out.size(), x.size() * 4);
    FakeQuantize(f, x);
    EXPECT_EQ(std::memcmp(out.data(), x.data(), out.size()), 0) << format;
  }
}

TEST(KvfmtTest, BadInputGivesOneLineErrorAndNonZeroExit) {
  TempDir dir;
  std::vector<float> x(100, 1.0f);  // not a whole number of 512-value rows
  Write(dir.File("in.f32"), x.data(), x.size() * 4);
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  } cases[] = {
      {{"quantize", "--format", "nvfp4", "--in", dir.File("in.f32"), "--out", dir.File("o"),
        "--dim", "32"},
       "unknown KV format \"nvfp4\""},
      {{"quantize", "--format", "main", "--in", dir.File("in.f32"), "--out", dir.File("o"),
        "--config", kConfig},
       "400 bytes, not a whole number of 512-value float32 rows"},
      {{"quantize", "--format", "main", "--in", dir.File("in.f32"), "--out", dir.File("o")},
       "give --config FILE or --dim N"},
      {{"quantize", "--format", "main", "--in", dir.File("in.f32"), "--out", dir.File("o"), "--dim",
        "24"},
       "row length 24 is not a positive multiple of 16"},
      {{"dequantize", "--format", "index", "--in", dir.File("in.f32"), "--out", dir.File("o"),
        "--dim", "128"},
       "not a whole number of packed index rows of 128 values (68 B each)"},
      {{"quantize", "--format", "main", "--in", dir.File("missing"), "--out", dir.File("o"),
        "--dim", "16"},
       "cannot open"},
      {{"quantize", "--format", "main"}, "kvfmt: error:"},
      {{"layout", "--config", kConfig, "--chunk-tokens", "100"},
       "chunk_tokens 100 is not a multiple of 8"},
  };
  for (const Case& c : cases) {
    auto r = RunProgram(kKvfmt, c.args);
    EXPECT_NE(r.exit_code, 0) << c.expect;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(KvfmtTest, LayoutPrintsTheChunk) {
  auto r = RunProgram(kKvfmt, {"layout", "--config", kConfig});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("227840 bytes (890.00 B/token)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("index_scales"), std::string::npos);
}

}  // namespace
}  // namespace kvc
