// Prometheus metrics of kvcached, served in the text format by an HTTP exposer:
//   kvcache_rpc_seconds{method,code}   histogram of call latency
//   kvcache_bytes_total{direction}     chunk payload bytes in (Store) and out (Fetch)
//   kvcache_chunks{tier}, kvcache_capacity_chunks{tier}, kvcache_hits_total{tier},
//   kvcache_misses_total, kvcache_checksum_failures_total, kvcache_read_errors_total,
//   kvcache_write_errors_total, kvcache_evictions_total{tier}, kvcache_demotions_total,
//   kvcache_promotions_total, kvcache_pending_write_behind, kvcache_index_rebuilds_total,
//   kvcache_recovered_chunks
//                                      read from the store at scrape time.
// Thread-safe (prometheus-cpp metrics are atomic).
#pragma once

#include <grpcpp/support/status.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
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

  // Serves /metrics on HOST:PORT (port 0: any); returns the port bound.
  absl::StatusOr<int> Serve(const std::string& listen);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::cachesvc
