// LeaseTable: the leases of RAM (and HBM) slots kvcached hands to co-located clients
// (FetchRefs, FetchDeviceRefs). A held lease keeps its slots from being reused, so the
// bytes a client copies out of shared memory cannot change under it; each tenant holds at
// most `max_per_tenant` at once, and a lease ends when its tenant releases it or its time
// runs out (Reap, on every FetchRefs and from the service's reaper thread). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "storage/chunk_store.h"

namespace kvc::cachesvc {

class LeaseTable {
 public:
  struct Lease {
    std::string tenant;
    std::vector<storage::RamLease> ram;
    std::chrono::steady_clock::time_point expires;
    std::vector<storage::HbmLease> hbm;  // FetchDeviceRefs
  };

  explicit LeaseTable(size_t max_per_tenant) : max_per_tenant_(max_per_tenant) {}

  // Keeps `lease` until released or expired; its id. ResourceExhausted (nothing kept) when
  // its tenant holds max_per_tenant already.
  absl::StatusOr<uint64_t> Hold(Lease lease);
  // Ends the tenant's lease `id`; NotFound if it has none of that id (released, expired, or
  // another tenant's).
  absl::Status Release(const std::string& tenant, uint64_t id);
  // Ends every lease past its time.
  void Reap();

 private:
  using Leases = std::map<uint64_t, Lease>;
  Leases::iterator Forget(Leases::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_per_tenant_;
  Mutex mu_;
  Leases leases_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> held_ ABSL_GUARDED_BY(mu_);  // per tenant
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvc::cachesvc
