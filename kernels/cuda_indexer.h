// The engine's indexer on the GPU (model::IndexerBackend): the queries go up and the
// pages holding the layer's index keys are brought up to date in a PageMirror (only pages
// written since the last call); scores come straight from the FP4 pages (Full:
// every visible position; with a candidate pool to apply: only the pool's positions), the
// candidate pool and the top-k are selected on the device, and only positions come back —
// the CPU's scores bit for bit and its selections position for position.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/indexer_backend.h"
#include "kernels/page_mirror.h"

namespace kvc::cuda {

// FailedPrecondition without a GPU. `mirror`: shared with the attention backend (null: its own).
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::IndexerBackend>> MakeCudaIndexer(
    std::shared_ptr<PageMirror> mirror = nullptr);

}  // namespace kvc::cuda
