#include "bench/kvbench/block_device.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kvc::bench {

std::optional<BlockDevice> BlockDevice::For(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return std::nullopt;
  const std::string sys = absl::StrCat("/sys/dev/block/", major(st.st_dev), ":", minor(st.st_dev));
  std::error_code ec;
  if (!std::filesystem::exists(sys + "/stat", ec)) return std::nullopt;
  const std::string name = std::filesystem::canonical(sys, ec).filename().string();
  return BlockDevice(sys + "/stat", ec ? sys : name);
}

std::optional<DeviceBytes> BlockDevice::Read() const {
  std::ifstream in(stat_path_);
  // Fields (Documentation/block/stat.rst): reads, merges, sectors read, ticks, writes,
  // merges, sectors written, …; sectors are 512 bytes whatever the device's own size.
  uint64_t f[7] = {};
  for (uint64_t& v : f) {
    if (!(in >> v)) return std::nullopt;
  }
  return DeviceBytes{f[2] * 512, f[6] * 512};
}

}  // namespace kvc::bench
