// DeviceArena: one contiguous allocation in accelerator memory that the HBM tier (T0)
// keeps chunks in. The CUDA implementation (kernels/hbm_arena.h) allocates it on a GPU and
// exports it to co-located processes as a CUDA IPC handle; the storage code only copies
// bytes in and out through this interface, so it builds and is tested without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"

namespace kvc::storage {

class DeviceArena {
 public:
  virtual ~DeviceArena() = default;
  virtual uint64_t bytes() const = 0;
  // Host → device; returns once the bytes are in place (the host span may be reused).
  [[nodiscard]] virtual absl::Status Write(uint64_t offset, std::span<const uint8_t> host) = 0;
  // Device → host (checks and tools).
  [[nodiscard]] virtual absl::Status Read(uint64_t offset, std::span<uint8_t> host) const = 0;
  // What another process on the same machine needs to map the arena (for CUDA: the
  // cudaIpcMemHandle_t bytes) and the device it lives on.
  virtual std::string ExportHandle() const = 0;
  virtual int device() const = 0;
  // Identifies this allocation (changes when the arena is recreated, e.g. on restart).
  virtual uint64_t id() const = 0;
};

}  // namespace kvc::storage
