// A DeviceArena in host memory: the HBM tier's bookkeeping and the service's
// FetchDeviceRefs path run on machines without a GPU over it (the CUDA arena is
// kernels/hbm_arena.h, exercised where a GPU is present).
#pragma once

#include <cstring>
#include <vector>

#include "storage/device_arena.h"

namespace kvc::testing {

class HostArena final : public storage::DeviceArena {
 public:
  explicit HostArena(uint64_t bytes) : mem_(bytes) {}
  uint64_t bytes() const override { return mem_.size(); }
  absl::Status Write(uint64_t offset, std::span<const uint8_t> host) override {
    if (offset + host.size() > mem_.size()) return absl::OutOfRangeError("past the arena");
    std::memcpy(mem_.data() + offset, host.data(), host.size());
    return absl::OkStatus();
  }
  absl::Status Read(uint64_t offset, std::span<uint8_t> host) const override {
    if (offset + host.size() > mem_.size()) return absl::OutOfRangeError("past the arena");
    std::memcpy(host.data(), mem_.data() + offset, host.size());
    return absl::OkStatus();
  }
  std::string ExportHandle() const override { return "host-arena"; }
  int device() const override { return -1; }
  uint64_t id() const override { return 42; }

 private:
  std::vector<uint8_t> mem_;
};

}  // namespace kvc::testing
