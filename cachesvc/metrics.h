// Prometheus metrics of kvcached, served in the text format by an HTTP exposer:
//   kvcache_rpc_seconds{method,code}   histogram of call latency
//   kvcache_bytes_total{direction}     chunk payload bytes in (Store) and out (Fetch)
//   kvcache_lookup_tokens_total{tenant,namespace,tier}
//                                      tokens of the prefixes looked up, by the tier that
//                                      holds them (hbm, ram, ssd; none past the leading run):
//                                      per namespace they sum to the tokens looked up
//   kvcache_chunks{tier}, kvcache_capacity_chunks{tier}, kvcache_hits_total{tier},
//   kvcache_misses_total, kvcache_checksum_failures_total, kvcache_read_errors_total,
//   kvcache_write_errors_total, kvcache_evictions_total{tier}, kvcache_demotions_total,
//   kvcache_promotions_total, kvcache_pending_write_behind, kvcache_index_rebuilds_total,
//   kvcache_recovered_chunks
//                                      read from the store at scrape time.
//   kvcache_repair_under_replicated_chunks, kvcache_repair_under_replicated_bytes,
//   kvcache_repair_copied_chunks_total, kvcache_repair_copied_bytes_total,
//   kvcache_repair_failed_copies_total, kvcache_repair_passes_total,
//   kvcache_repair_last_pass_timestamp_seconds, kvcache_repair_pending,
//   kvcache_repair_copy_bytes_per_second, kvcache_repair_unplaceable_chunks
//                                      a cluster node's repair (repair.h), at scrape time.
// Thread-safe (prometheus-cpp metrics are atomic).
#pragma once

#include <grpcpp/support/status.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvcache/v1/kvcache.pb.h"
#include "storage/chunk_store.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace kvc::cachesvc {

class ServiceMetrics {
 public:
  explicit ServiceMetrics(const storage::ChunkStore* store);
  ~ServiceMetrics();

  void ObserveCall(const std::string& method, grpc::StatusCode code, double seconds);
  void AddBytes(bool in, uint64_t bytes);
  // `tokens` of a Lookup of `tenant`'s namespace `ns` answered from `tier`.
  void AddLookupTokens(const std::string& tenant, uint32_t ns, const char* tier, uint64_t tokens);
  // A cluster node's repair state, read at every scrape (null: none; the series are absent).
  void SetRepairSource(std::function<void(kvcache::v1::RepairStats*)> source);

  // Serves /metrics on HOST:PORT (port 0: any); returns the port bound.
  absl::StatusOr<int> Serve(const std::string& listen);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::cachesvc
