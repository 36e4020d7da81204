// LocalCeph: a single-host Ceph cluster for the demo and the benchmarks (docs/rados.md) —
// scripts/ceph-up.sh in a folder (one monitor, one memstore OSD, a pool), ended when this
// goes, however the program leaves — also when its folder was removed first (a scratch
// folder a program empties on its way out): the daemons' pids are read at the start.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::serve {

class LocalCeph {
 public:
  // `source_dir`: the repository (its scripts/); `dir`: the cluster's folder (created);
  // `osd_bytes` 0: the script's default. Unavailable, naming the script's log, if it fails.
  static absl::StatusOr<std::unique_ptr<LocalCeph>> Start(const std::string& source_dir,
                                                          const std::string& dir,
                                                          const std::string& pool,
                                                          uint64_t osd_bytes = 0);
  ~LocalCeph();
  LocalCeph(const LocalCeph&) = delete;
  LocalCeph& operator=(const LocalCeph&) = delete;

  std::string conf() const { return dir_ + "/ceph.conf"; }
  const std::string& pool() const { return pool_; }
  // kvcached's flags for this cluster as its shared tier.
  std::vector<std::string> KvcachedFlags() const {
    return {"--rados-pool", pool_, "--ceph-conf", conf()};
  }

 private:
  LocalCeph(std::string source_dir, std::string dir, std::string pool)
      : source_dir_(std::move(source_dir)), dir_(std::move(dir)), pool_(std::move(pool)) {}
  std::string source_dir_, dir_, pool_;
  std::vector<int> pids_;  // the monitor's and the OSD's (ceph-up.sh's mon.pid, osd.pid)
};

}  // namespace kvc::serve
