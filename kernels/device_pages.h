// DevicePages: the engine's paged global KV in device memory, with the chunk layout as
// page layout (a fetched chunk is copied up as is, never repacked), filled by
// asynchronous host-to-device copies on its own stream so that uploads overlap compute.
// Host buffers registered with RegisterHost (page-locked in place, e.g. the mapped RAM
// arena) copy at full bus speed; others are staged by the driver.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/spec/chunk_layout.h"

namespace kvc::cuda {

class DevicePages {
 public:
  // FailedPrecondition without a GPU; ResourceExhausted when the device has no room.
  static absl::StatusOr<std::unique_ptr<DevicePages>> Create(const ChunkLayout& layout,
                                                             int64_t capacity_chunks);
  ~DevicePages();
  DevicePages(const DevicePages&) = delete;
  DevicePages& operator=(const DevicePages&) = delete;

  // Queues a copy of whole pages from `host` into pages [first, first + n); returns at
  // once. `host` must stay valid until Synchronize.
  [[nodiscard]] absl::Status UploadAsync(int64_t first, std::span<const uint8_t> host);
  // Queues a device-to-device copy of one whole page from `device_src` (device memory of
  // this process, e.g. a mapped HBM tier) into page `page`.
  [[nodiscard]] absl::Status CopyPageFromDeviceAsync(int64_t page, const uint8_t* device_src);
  [[nodiscard]] absl::Status Synchronize();
  // Copies pages [first, first + n) back (for checks).
  [[nodiscard]] absl::Status Download(int64_t first, std::span<uint8_t> host) const;

  // Page-locks an existing host range in place (read-only use), so uploads from it run at
  // bus speed; Unregister undoes it.
  [[nodiscard]] static absl::Status RegisterHost(std::span<const uint8_t> host);
  static void UnregisterHost(std::span<const uint8_t> host);

  const uint8_t* device() const { return pages_; }
  int64_t capacity_chunks() const { return capacity_; }
  const ChunkLayout& layout() const { return layout_; }

 private:
  DevicePages(const ChunkLayout& layout, int64_t capacity) : layout_(layout), capacity_(capacity) {}
  ChunkLayout layout_;
  int64_t capacity_ = 0;
  uint8_t* pages_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t
};

}  // namespace kvc::cuda
