#include "cachesvc/lease_table.h"

#include "absl/strings/str_cat.h"
#include "base/check.h"

namespace kvc::cachesvc {

absl::StatusOr<uint64_t> LeaseTable::Hold(Lease lease) {
  MutexLock lock(mu_);
  size_t& held = held_[lease.tenant];
  if (held >= max_per_tenant_) {
    const std::string tenant = lease.tenant;
    if (held == 0) held_.erase(tenant);
    return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant, " holds ", max_per_tenant_,
                                                     " shared-memory leases already (the limit)"));
  }
  ++held;
  const uint64_t id = ++next_id_;
  leases_.emplace(id, std::move(lease));
  return id;
}

absl::Status LeaseTable::Release(const std::string& tenant, uint64_t id) {
  MutexLock lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.tenant != tenant) {
    return absl::NotFoundError(absl::StrCat("lease ", id, " not found (released or expired)"));
  }
  Forget(it);
  return absl::OkStatus();
}

void LeaseTable::Reap() {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    it = it->second.expires <= now ? Forget(it) : std::next(it);
  }
}

LeaseTable::Leases::iterator LeaseTable::Forget(Leases::iterator it) {
  auto held = held_.find(it->second.tenant);
  KVC_CHECK(held != held_.end() && held->second > 0)
      << "tenant " << it->second.tenant << " releases a lease it does not hold";
  if (--held->second == 0) held_.erase(held);
  return leases_.erase(it);
}

}  // namespace kvc::cachesvc
