// How much of the disk the SSD tier may take: what its slab files already hold plus the
// free space, less a reserve for the index and everything else on that file system. The
// daemon sizes the tier to this at start (and says so), so laying out slabs can never fill
// the disk.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvc::storage {

struct DiskSpace {
  uint64_t total_bytes = 0;  // of the file system
  uint64_t free_bytes = 0;   // available to this user
  uint64_t slab_bytes = 0;   // already allocated to the tier's slab files
};

// The space left free for the index (RocksDB's WAL and tables) and the rest of the
// system: 5 % of the file system, at least 1 GiB (never more than the file system).
uint64_t ReservedBytes(const DiskSpace& d);

// The SSD capacity that fits: min(requested, slab_bytes + free_bytes - reserve). Never less
// than what the slabs already hold, so a restart on a fuller disk never drops chunks.
uint64_t FitSsdBytes(uint64_t requested, const DiskSpace& d);

// Measures the file system holding data_dir and the slab files under data_dir/slabs.
// InternalError naming the path if statvfs fails.
absl::StatusOr<DiskSpace> MeasureDiskSpace(const std::string& data_dir);

}  // namespace kvc::storage
