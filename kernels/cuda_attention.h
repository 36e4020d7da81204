// The engine's sparse attention on the GPU (model::AttentionBackend): per call, the
// queries, window rows and entry lists go up, and the pages holding the listed compressed
// rows are brought up to date in a PageMirror (only pages written since the last call),
// the CPU-twin kernel (kv_ops_kernel.cuh: AttendHead's arithmetic, the shared ExpF) reads
// the compressed rows from the FP4 pages, and the outputs come back — the CPU's bits.
// With a device matmul backend (cuda or cublas) as the model's, AttendAndProject keeps the
// output on the device through the inverse RoPE and the output projection (on the matmul
// backend's resident weights, DeviceProducts): one wait instead of three, the same bits as
// the steps one by one.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/attention_backend.h"
#include "kernels/page_mirror.h"

namespace kvc::cuda {

// FailedPrecondition without a GPU. `mirror`: shared with the indexer backend (null: its own).
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::AttentionBackend>> MakeCudaAttention(
    std::shared_ptr<PageMirror> mirror = nullptr);

}  // namespace kvc::cuda
