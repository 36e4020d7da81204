// PowerCut: a test seam that models the machine losing power under a running store (and,
// separately, a full disk).
//
// The store's slab I/O (WrapIoEngine) and its index files (file_system(), a RocksDB
// FileSystem) report to one PowerCut. It remembers what was written since each file's last
// completed fsync/fdatasync: for slabs the bytes each write replaced, for index files
// (append-only) the length last synced. At Cut() the power is gone: from then on no write,
// sync, rename or delete reaches the disk, though callers are told they succeeded (the
// store, being destroyed, cannot tell). Once the store is gone, Restore() leaves the disk
// as a power cut could: every unsynced slab write is kept, dropped or torn at a 4 KiB
// sector, and every index file keeps a random part of its unsynced tail — each drawn from
// the seed. Synced bytes are never touched. RocksDB's FaultInjectionTestFS works the same
// way for its own tests. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/mutex.h"
#include "storage/io_engine.h"

namespace rocksdb {
class FileSystem;
}

namespace kvc::storage {

class PowerCut : public std::enable_shared_from_this<PowerCut> {
 public:
  // drop_all: Restore drops every unsynced byte instead of drawing each write's fate.
  explicit PowerCut(uint64_t seed, bool drop_all = false) : drop_all_(drop_all), rng_(seed) {}

  std::unique_ptr<IoEngine> WrapIoEngine(std::unique_ptr<IoEngine> base);
  std::shared_ptr<rocksdb::FileSystem> file_system();

  void Cut() { cut_.store(true); }
  bool cut() const { return cut_.load(); }
  // A full disk (independent of cuts): while set, every append to an index file fails
  // with ENOSPC; clearing it gives the space back. (Slab writes overwrite preallocated
  // blocks, so a full file system never fails them.)
  void set_disk_full(bool full) { disk_full_.store(full); }
  bool disk_full() const { return disk_full_.load(); }
  // Call after every user of the seams is gone.
  [[nodiscard]] absl::Status Restore();

  struct Counts {
    uint64_t slab_writes_kept = 0, slab_writes_dropped = 0, slab_writes_torn = 0;
    uint64_t index_files_cut = 0, index_bytes_dropped = 0;
  };
  Counts counts() const {
    MutexLock lock(mu_);
    return counts_;
  }

  // ---- for the seams ----
  // A slab write about to go out: `before` holds the bytes it replaces.
  uint64_t RecordSlabWrite(int fd, uint64_t offset, std::vector<uint8_t> before);
  void SlabWriteDone(uint64_t id);
  // fd's data synced: every write done before `first_unsynced` is durable now.
  uint64_t NextSlabWriteId() const {
    MutexLock lock(mu_);
    return next_write_id_;
  }
  void SlabSynced(int fd, uint64_t first_unsynced);
  void IndexFileOpened(const std::string& path, uint64_t length, bool created_after_cut);
  void IndexFileAppended(const std::string& path, uint64_t end);
  void IndexFileSynced(const std::string& path);
  void IndexFileRenamed(const std::string& from, const std::string& to);
  void IndexFileDeleted(const std::string& path);

 private:
  struct SlabWrite {
    std::string path;
    uint64_t offset = 0;
    std::vector<uint8_t> before;
    bool done = false;
  };
  struct IndexFile {
    uint64_t length = 0, synced = 0;
    bool created_after_cut = false;
  };

  const bool drop_all_;
  std::atomic<bool> cut_{false};
  std::atomic<bool> disk_full_{false};
  mutable Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  uint64_t next_write_id_ ABSL_GUARDED_BY(mu_) = 0;
  // By write id, in issue order.
  std::map<uint64_t, SlabWrite> unsynced_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, IndexFile> index_files_ ABSL_GUARDED_BY(mu_);
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::storage
