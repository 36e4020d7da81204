// RamArena: one pool of the host-RAM tier's memory, a shared-memory file (memfd) of fixed
// slots (the RAM tier makes them 4 KiB pages, and a chunk takes a run of them). A
// co-located process can map the arena and read a chunk without a copy; the store hands
// out leases so memory being read is never reused under the reader. The arena itself is
// just memory: bookkeeping lives in the store (ram_tier.h).
//
// Sealed against its readers: once created, the memfd carries F_SEAL_FUTURE_WRITE,
// F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL. This process keeps the one writable mapping
// it made before sealing; nobody — holder of read_only_fd(), of a /proc/PID/fd reopen of
// it, or this process itself — can make another writable mapping, write(2) it, punch holes
// in it, or resize it. So a client that maps the arena can read it but never change a
// chunk under the server or under another reader.
//
// After the slots, one 4 KiB verdict page: its first 8 bytes count the copies the store
// dropped from this arena as corrupt (a RAM scrub's verdict, ChunkStore::ScrubRam). A
// client that copies a chunk again from a lease it holds reads the count first; a change
// since it took the lease means a verdict it has not heard, so it asks the daemon instead
// (wire/arena_handshake.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvc::storage {

class RamArena {
 public:
  // InternalError with errno text if memfd_create, ftruncate, mmap or sealing fail.
  // prefault: every page is faulted in now (MADV_POPULATE_WRITE; skipped where the kernel
  // lacks it), so the arena's memory is taken at once and later fills — first writes,
  // promotions of SSD hits — pay no first-touch page faults.
  static absl::StatusOr<std::unique_ptr<RamArena>> Create(uint64_t slot_bytes, uint32_t slots,
                                                          const std::string& name,
                                                          bool prefault = false);
  ~RamArena();
  RamArena(const RamArena&) = delete;
  RamArena& operator=(const RamArena&) = delete;

  // An fd opened read-only on the sealed memfd: what is handed to co-located clients.
  int read_only_fd() const { return read_only_fd_; }
  // The whole memfd: the slots, then the verdict page (none without slots).
  uint64_t bytes() const { return slots_ == 0 ? 0 : verdict_offset() + kVerdictPageBytes; }
  uint64_t verdict_offset() const { return slot_bytes_ * slots_; }
  static constexpr uint64_t kVerdictPageBytes = 4096;
  // Counts one more copy dropped as corrupt (a release store: a reader that sees the new
  // count also sees the store's bookkeeping that dropped it).
  void AddVerdict() const {
    if (slots_ > 0)
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + verdict_offset()))
          .fetch_add(1, std::memory_order_release);
  }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }
  // The store's own (writable) view of slot i.
  uint8_t* slot(uint32_t i) const { return base_ + static_cast<uint64_t>(i) * slot_bytes_; }
  uint64_t slot_offset(uint32_t i) const { return static_cast<uint64_t>(i) * slot_bytes_; }

 private:
  RamArena(int fd, int read_only_fd, uint8_t* base, uint64_t slot_bytes, uint32_t slots)
      : fd_(fd), read_only_fd_(read_only_fd), base_(base), slot_bytes_(slot_bytes), slots_(slots) {}
  int fd_;
  int read_only_fd_;
  uint8_t* base_;
  uint64_t slot_bytes_;
  uint32_t slots_;
};

}  // namespace kvc::storage
