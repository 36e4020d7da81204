#include "storage/disk_space.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace kvc::storage {

uint64_t ReservedBytes(const DiskSpace& d) {
  return std::min(d.total_bytes, std::max<uint64_t>(1ull << 30, d.total_bytes / 20));
}

uint64_t FitSsdBytes(uint64_t requested, const DiskSpace& d) {
  const uint64_t reserve = ReservedBytes(d);
  const uint64_t usable = d.slab_bytes + (d.free_bytes > reserve ? d.free_bytes - reserve : 0);
  return std::min(requested, std::max(usable, d.slab_bytes));
}

absl::StatusOr<DiskSpace> MeasureDiskSpace(const std::string& data_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path probe = data_dir;
  while (!fs::exists(probe, ec) && probe.has_parent_path() && probe != probe.parent_path())
    probe = probe.parent_path();  // not made yet: its nearest existing parent's file system
  struct statvfs v {};
  if (statvfs(probe.c_str(), &v) != 0)
    return absl::InternalError(absl::StrCat("statvfs ", probe.string(), ": ", strerror(errno)));
  DiskSpace d;
  d.total_bytes = static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
  d.free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  // Every size class's slabs: slabs/ and its cBYTES/ folders.
  for (auto it = fs::recursive_directory_iterator(fs::path(data_dir) / "slabs", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (stat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      d.slab_bytes += static_cast<uint64_t>(st.st_blocks) * 512;  // allocated, not apparent
  }
  return d;
}

}  // namespace kvc::storage
