// The HBM tier's device memory on a GPU, and the other end of its CUDA IPC export.
//
// kvcached keeps T0 (storage/hbm_tier.h) in one cudaMalloc allocation and hands its
// cudaIpcMemHandle_t to co-located engines (FetchDeviceRefs). An engine maps it once
// (MappedHbmArena) and copies leased chunks device-to-device into its DevicePages — no
// trip through host memory — or reads them in place while the lease holds.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/device_pages.h"
#include "storage/device_arena.h"

namespace kvc::cuda {

// `bytes` of memory on GPU `device`, exportable over CUDA IPC. FailedPrecondition without
// that device; ResourceExhausted when it has no room.
[[nodiscard]] absl::StatusOr<std::unique_ptr<storage::DeviceArena>> MakeHbmArena(int device,
                                                                                 uint64_t bytes);

// A chunk in a mapped arena: bytes [offset, offset + length).
struct HbmChunk {
  uint64_t offset = 0, length = 0;
};

class MappedHbmArena {
 public:
  // Maps the arena exported as `handle` (ExportHandle's bytes) on GPU `device`.
  // InvalidArgument for a handle of the wrong size; FailedPrecondition without the device;
  // Internal when CUDA refuses it (e.g. the exporting process is gone, or it is this one).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MappedHbmArena>> Open(std::string_view handle,
                                                                            int device);
  ~MappedHbmArena();
  MappedHbmArena(const MappedHbmArena&) = delete;
  MappedHbmArena& operator=(const MappedHbmArena&) = delete;

  const uint8_t* base() const { return base_; }
  // Queues device-to-device copies of `chunks` (each exactly one page) into pages
  // first, first + 1, … of `pages`; complete after pages.Synchronize().
  [[nodiscard]] absl::Status CopyToPages(std::span<const HbmChunk> chunks, DevicePages& pages,
                                         int64_t first) const;
  // Copies `chunks` one after another into `out` (exactly their total length), done when it
  // returns: for an engine whose pages live in host memory.
  [[nodiscard]] absl::Status CopyToHost(std::span<const HbmChunk> chunks,
                                        std::span<uint8_t> out) const;

 private:
  MappedHbmArena() = default;
  uint8_t* base_ = nullptr;
  int device_ = 0;
};

}  // namespace kvc::cuda
