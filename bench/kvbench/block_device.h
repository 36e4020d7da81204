// BlockDevice: the counters of the block device under a folder (/sys/dev/block/M:m/stat),
// so a storage benchmark can say what the disk itself read and wrote beside the payload a
// system claims to have moved. Other work on the same disk counts too: compare within one
// run, as everything else here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kvc::bench {

struct DeviceBytes {
  uint64_t read = 0, written = 0;
};

class BlockDevice {
 public:
  // The device holding `dir`, or nullopt when it has no block device (tmpfs, overlay).
  static std::optional<BlockDevice> For(const std::string& dir);
  const std::string& name() const { return name_; }  // "vda", "nvme0n1p2", …
  // Bytes read and written since boot (sectors × 512), or nullopt if the file is gone.
  std::optional<DeviceBytes> Read() const;

 private:
  BlockDevice(std::string stat_path, std::string name)
      : stat_path_(std::move(stat_path)), name_(std::move(name)) {}
  std::string stat_path_, name_;
};

}  // namespace kvc::bench
