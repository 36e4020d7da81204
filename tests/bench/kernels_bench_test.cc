// `kvbench kernels` end to end on small cases of the mini config, in process: every case
// and field is there, the timings are positive, our GEMM keeps a row's bits across call
// heights, and the text table renders. Built only against the CPU emulation of CUDA
// (tests/cudaemu), where it checks the benchmark's own code before a GPU runs it (its
// numbers there mean nothing); on a GPU, KvbenchTest.KernelsRunOnAGpuOrSayWhyNot runs the
// real program.
#include "bench/kvbench/kernels_bench.h"

#include "gtest/gtest.h"

namespace kvc::bench {
namespace {

TEST(KernelBenchTest, EveryCaseRunsAndReportsEveryField) {
  KernelBenchOptions o;
  o.config = std::string(KVC_SOURCE_DIR) + "/configs/mini.json";
  o.contexts = {4096};
  o.batches = {1, 3};
  o.indexer_contexts = {2048, 8192};
  o.upload_mib = 1;
  o.repetitions = 1;
  absl::StatusOr<nlohmann::json> r = RunKernelBench(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const nlohmann::json& j = *r;
  EXPECT_GT(j["copy_gbps"].get<double>(), 0);
  ASSERT_EQ(j["attention"].size(), 2u);
  for (const auto& a : j["attention"]) {
    for (const char* k : {"twin_us", "tiled_us", "twin_gbps", "tiled_gbps", "tiled_over_copy"}) {
      EXPECT_GT(a[k].get<double>(), 0) << k << " " << a;
    }
  }
  ASSERT_EQ(j["indexer"].size(), 2u);
  for (const auto& i : j["indexer"]) {
    EXPECT_GT(i["full_us"].get<double>(), 0) << i;
    EXPECT_GT(i["pool_us"].get<double>(), 0) << i;
    EXPECT_GT(i["pool_positions"].get<int64_t>(), 0) << i;
    EXPECT_LE(i["pool_positions"].get<int64_t>(), i["positions"].get<int64_t>()) << i;
  }
  EXPECT_GT(j["upload"]["pages_over_pinned"].get<double>(), 0) << j["upload"];
  ASSERT_EQ(j["gemm"].size(), 3u);
  for (const auto& g : j["gemm"]) {
    EXPECT_TRUE(g["ours_rows_batch_invariant"].get<bool>()) << g;
    EXPECT_GT(g["ours_over_cublas"].get<double>(), 0) << g;
  }
  const std::string text = KernelBenchToText(j);
  EXPECT_NE(text.find("attention"), std::string::npos) << text;
  EXPECT_NE(text.find("gemm"), std::string::npos) << text;
}

}  // namespace
}  // namespace kvc::bench
