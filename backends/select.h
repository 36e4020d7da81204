// The backends a program's --backend flag names: "cpu" (the default), "cuda" (matrix
// products, the indexer and attention on the GPU, with the CPU's bits) or "cublas"
// (products through cuBLAS, the rest as for cuda; no exact replay). The GPU ones exist only in
// builds with the CUDA backend; elsewhere they are a clear error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/model/matmul.h"
#include "engine/model/model.h"

namespace kvc::model {

// Sets options.matmul, .indexer and .attention for `name`. InvalidArgument for an unknown
// name, or for `exact_replay` with a backend that is not batch invariant (cublas);
// FailedPrecondition for a GPU backend without a GPU or in a build without CUDA.
absl::Status SelectBackends(const std::string& name, bool exact_replay, ModelOptions& options);

// Reads chunks leased in a co-located kvcached's HBM tier: maps the arena exported as
// `ipc_handle` on `device` (once per arena_id, kept for the process) and copies the chunks
// at `offsets` (chunk_bytes each) one after another into `out`. The signature of
// serve::ConnectorOptions::hbm_reader.
using HbmChunkReader = std::function<absl::Status(
    std::string_view ipc_handle, int device, uint64_t arena_id, std::span<const uint64_t> offsets,
    uint64_t chunk_bytes, std::span<uint8_t> out)>;
// Null in a build without CUDA or on a machine without a GPU: chunks then come by Fetch.
HbmChunkReader MakeHbmChunkReader();

}  // namespace kvc::model
