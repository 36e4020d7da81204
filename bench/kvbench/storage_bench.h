// kvbench storage: store and fetch throughput and latency of the RAM tier (T1) and the
// SSD tier (T2), each beside the peer a user would pick instead, measured in the same run
// on the same folder, alternating ours and the peers and reporting medians:
//   fetch/store T2  vs fio (io_uring, O_DIRECT, same I/O size and depth; store with one
//                   fdatasync per `depth` writes, like our durable batch),
//                   a file per chunk with pread (LMCache's local-disk layout), and
//                   RocksDB with blob files (direct reads, synced writes);
//   fetch/store T1  vs memcpy of the same blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct StorageBenchOptions {
  std::string dir;           // scratch folder on the disk under test
  uint64_t chunk_bytes = 0;  // from the model config
  double seconds = 1.0;      // per measured run
  int repetitions = 3;       // runs per (system, op, depth), alternated
  std::vector<int> depths = {1, 8, 32};
  std::vector<std::string> ops = {"fetch", "store"};
  uint64_t dataset_chunks = 512;  // chunks each system reads from (more defeats caches)
  bool run_fio = true;
};

struct BenchCase {
  // system: kvcache-t1, kvcache-t2, fio, file-per-chunk, rocksdb-blob or memcpy;
  // mode: "concurrent" (depth = operations in flight) or "batch" (one caller, depth chunks
  // per call).
  std::string system, mode, op;
  int depth = 0;
  double gbps = 0, p50_us = 0, p99_us = 0;
  // What the block device under --dir did meanwhile (medians; -1 without a block device):
  // its bytes per second, and its bytes per payload byte (amplification).
  double device_read_gbps = -1, device_write_gbps = -1, device_amplification = -1;
  // CPU time (user + system, this process and the children it waited for — fio) per chunk
  // moved during the run: what one chunk costs the machine beside the disk's time.
  double cpu_us_per_chunk = 0;
};

// Runs every case; the folder is left empty. Errors name the system that failed.
absl::StatusOr<std::vector<BenchCase>> RunStorageBench(const StorageBenchOptions& options);

nlohmann::json CasesToJson(const std::vector<BenchCase>& cases);
// Table plus the ratios the project tracks (T2 fetch / fio, T2 store / fio, T1 / memcpy).
std::string CasesToText(const std::vector<BenchCase>& cases);

}  // namespace kvc::bench
