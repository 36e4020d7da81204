// SsdTier: the slab files of the SSD tier and the I/O on them.
//
// Slabs are preallocated files (slab-000000.dat, ...) of slots_per_slab fixed slots each,
// opened with O_DIRECT; every slot is 4 KiB-aligned and holds a header (slot_format.h)
// and one chunk. Slot numbers are global: slab = n / slots_per_slab. I/O goes through a
// small pool of lanes, each an IoEngine with its own registered, aligned staging
// buffers, so concurrent callers batch independently. Which slots are free is the
// store's business, not this class's. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "storage/fault_injection.h"
#include "storage/io_engine.h"
#include "storage/payload.h"
#include "storage/power_cut.h"
#include "storage/slot_format.h"

namespace kvc::storage {

struct SsdTierOptions {
  std::string dir;  // created if missing
  uint64_t slot_bytes = 0;
  uint64_t capacity_slots = 0;
  uint64_t slots_per_slab = 1024;
  IoBackend backend = IoBackend::kAuto;
  unsigned queue_depth = 32;  // ops in flight per lane, and staging buffers per lane
  unsigned lanes = 4;
  // The staging buffers of all lanes take at most this much (at least one slot per lane):
  // the queue depth is cut to fit, so a class of 8 MiB slots holds a few, not 32 × lanes.
  uint64_t staging_bytes = 32ull << 20;
  // Whenever a slab is first used, the next one is laid out on a background thread (a size
  // class grows into its slabs on demand), instead of every slab up front.
  bool lay_out_ahead = false;
  uint16_t slot_format = kSlotFormatVersion;  // the folder's (slot_format.h)
  std::shared_ptr<FaultPlan> faults;          // tests: wrap every lane's engine
  std::shared_ptr<PowerCut> power_cut;        // tests: likewise
};

struct SlotWrite {
  uint64_t slot = 0;
  SlotHeader header;
  Payload payload;
};

struct SlotRead {
  uint64_t slot = 0;
  SlotHeader expected;
  std::span<uint8_t> out;  // payload destination, header.payload_bytes long
  // The caller's buffer also holds header_bytes() before `out` and reaches to the end of the
  // slot's I/O (SlotBytesFor): the slot is read straight into it when that start is aligned
  // for direct I/O, and verified there — no staging buffer, no copy. (What a failed read
  // leaves there is not the chunk: only an OK status says it is.)
  bool in_place = false;
};

class SsdTier {
 public:
  static absl::StatusOr<std::unique_ptr<SsdTier>> Open(const SsdTierOptions& options);
  ~SsdTier();

  // Writes every slot (not yet durable: see SyncSlabs). Fills each header's
  // payload_checksum (computed from the staged copy, while it is in cache). One status per
  // write: Internal/ResourceExhausted on I/O errors, with the errno text.
  std::vector<absl::Status> Write(std::span<SlotWrite> writes);
  // Makes everything written to these slabs durable (fdatasync each).
  [[nodiscard]] absl::Status SyncSlabs(const std::set<uint64_t>& slabs);
  uint64_t slots_per_slab() const { return options_.slots_per_slab; }
  // Reads and verifies every slot: DataLoss when the bytes do not verify (nothing is
  // copied to `out` then), Internal on I/O errors.
  std::vector<absl::Status> Read(std::span<SlotRead> reads);
  // Reads whole slots and decodes what each holds, for rebuilding the index: found(slot,
  // header) for every slot whose header and payload verify. Slots of slabs never laid
  // out are skipped (not created); bad bytes are not errors. A read that fails is tried
  // again (kScanReadAttempts in all: an I/O error may pass); a slot whose reads all fail
  // is listed in *unreadable and the scan goes on, or, with unreadable null, its error is
  // returned.
  static constexpr int kScanReadAttempts = 4;
  [[nodiscard]] absl::Status Scan(std::span<const uint64_t> slots,
                                  const std::function<void(uint64_t, const SlotHeader&)>& found,
                                  std::vector<uint64_t>* unreadable = nullptr);

  const char* backend_name() const { return backend_name_; }
  // Creates (zero-filled) every slab of the configured capacity now rather than on
  // first use, so no later write waits for a slab to be laid out.
  [[nodiscard]] absl::Status PreallocateAll();
  // Why the io_uring backend is not in use, empty if it is.
  const std::string& fallback_reason() const { return fallback_reason_; }
  uint64_t capacity_slots() const { return options_.capacity_slots; }
  // The slots up to the end of the last slab laid out on disk (no slot past it holds a
  // chunk): what a scan of every slot has to read.
  uint64_t LaidOutSlots();
  // Gives the slabs from `slab` on back to the disk (their files removed; laid out again
  // when next used). Nothing may use their slots meanwhile. The first error, if any.
  [[nodiscard]] absl::Status RemoveSlabsFrom(uint64_t slab);
  uint64_t slot_bytes() const { return options_.slot_bytes; }
  uint32_t header_bytes() const { return SlotHeaderBytes(options_.slot_format); }
  bool direct_io() const { return direct_io_; }

 private:
  struct Lane {
    std::unique_ptr<IoEngine> engine;
    uint8_t* staging = nullptr;  // queue_depth aligned slots, registered with the engine
  };
  class LaneLease;

  explicit SsdTier(const SsdTierOptions& o) : options_(o) {}
  absl::Status Init();
  // Opens or creates (preallocated) the slab; in_use: for I/O now (with lay_out_ahead, the
  // next slab is then laid out in the background).
  absl::StatusOr<int> SlabFd(uint64_t slab, bool in_use = true);
  absl::StatusOr<int> CreateSlab(uint64_t slab);  // open + zero fill + sync; no lock held
  // fsync of a new slab file and of its folder (the entry); either failing is an error.
  absl::Status SyncNewFile(int fd, const std::string& path);
  // The I/O of one slot (header + payload, whole sectors) through staging buffer i of a lane,
  // or, with kLentLater, through the one lent to it as it goes out (StagingLoans).
  static constexpr int kLentLater = -1;
  absl::StatusOr<IoOp> SlotOp(IoOp::Kind kind, uint64_t slot, uint32_t payload_bytes,
                              const Lane& lane, int staging_index);
  // Whether the slab's file exists (opened, or on disk from an earlier run).
  bool SlabOnDisk(uint64_t slab);
  Lane* AcquireLane();
  void ReleaseLane(Lane* lane);

  SsdTierOptions options_;
  const char* backend_name_ = "posix";
  std::string fallback_reason_;
  std::atomic<bool> direct_io_{true};

  // Lays out slabs up to `lay_out_to_` (lay_out_ahead), one at a time.
  void LayOutAheadLoop();

  uint64_t slab_count_ = 0;  // fixed by Open
  Mutex slabs_mu_;
  std::condition_variable_any slab_ready_;
  std::vector<int> slab_fds_ ABSL_GUARDED_BY(slabs_mu_);  // -1 until opened
  // A thread is laying this slab out.
  std::vector<bool> slab_creating_ ABSL_GUARDED_BY(slabs_mu_);
  std::atomic<bool> stopping_{false};
  std::thread preallocator_;
  uint64_t lay_out_to_ ABSL_GUARDED_BY(slabs_mu_) = 0;  // slabs below it: wanted on disk
  std::condition_variable_any lay_out_wanted_;

  Mutex lanes_mu_;
  std::condition_variable_any lane_free_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // fixed by Open
  std::vector<Lane*> idle_lanes_ ABSL_GUARDED_BY(lanes_mu_);
};

}  // namespace kvc::storage
