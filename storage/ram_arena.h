// RamArena: the host-RAM tier's memory, one shared-memory file (memfd) of fixed slots.
// A co-located process can map fd() and read a slot without a copy; the store hands out
// leases so a slot being read is never reused under the reader. The arena itself is just
// memory: bookkeeping lives in the store.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace kvc::storage {

class RamArena {
 public:
  // InternalError with errno text if memfd_create, ftruncate or mmap fail.
  static absl::StatusOr<std::unique_ptr<RamArena>> Create(uint64_t slot_bytes, uint32_t slots);
  ~RamArena();
  RamArena(const RamArena&) = delete;
  RamArena& operator=(const RamArena&) = delete;

  int fd() const { return fd_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }
  uint8_t* slot(uint32_t i) const { return base_ + static_cast<uint64_t>(i) * slot_bytes_; }
  uint64_t slot_offset(uint32_t i) const { return static_cast<uint64_t>(i) * slot_bytes_; }

 private:
  RamArena(int fd, uint8_t* base, uint64_t slot_bytes, uint32_t slots)
      : fd_(fd), base_(base), slot_bytes_(slot_bytes), slots_(slots) {}
  int fd_;
  uint8_t* base_;
  uint64_t slot_bytes_;
  uint32_t slots_;
};

}  // namespace kvc::storage
