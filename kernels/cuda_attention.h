// The engine's sparse attention on the GPU (model::AttentionBackend): per call, the
// queries, window rows, entry lists and the pages holding the listed compressed rows go up,
// the CPU-twin kernel (kv_ops_kernel.cuh: AttendHead's arithmetic, the shared ExpF) reads
// the compressed rows from the FP4 pages, and the outputs come back — the CPU's bits.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/attention_backend.h"

namespace kvc::cuda {

// FailedPrecondition without a GPU.
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::AttentionBackend>> MakeCudaAttention();

}  // namespace kvc::cuda
