// kvbench kernels (GPU only): the CUDA backend's kernels beside the device's own measured
// limits, in the same run —
//   - sparse attention (dequant + MQA, decode) at long contexts, batch 1 and 64: bytes
//     moved per second vs a device-to-device copy (target: >= 60 %), for the CPU-twin and
//     the tiled kernel;
//   - the indexer vs context length: Full (every compressed position) grows with it,
//     Reindex over the candidate pool stays flat;
//   - host RAM → HBM page uploads (DevicePages, page-locked in place) vs cudaMemcpy from
//     pinned memory (target: >= 80 %);
//   - the batch-invariant GEMM vs cuBLAS SGEMM, and whether cuBLAS gives a row the same
//     bits in calls of different heights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct KernelBenchOptions {
  std::string config;  // model config (shapes); default the reference config
  std::vector<int64_t> contexts = {131072, 1048576};
  std::vector<int64_t> batches = {1, 64};
  std::vector<int64_t> indexer_contexts = {8192, 65536, 262144, 1048576};
  int64_t upload_mib = 512;
  int repetitions = 20;
};

// FailedPrecondition without a GPU or in a build without the CUDA backend.
absl::StatusOr<nlohmann::json> RunKernelBench(const KernelBenchOptions& options);
std::string KernelBenchToText(const nlohmann::json& result);

}  // namespace kvc::bench
