#include "cachesvc/quota_groups.h"

#include <optional>

#include "base/check.h"
#include "base/status_macros.h"

namespace kvc::cachesvc {

absl::Status QuotaGroups::Admit(const std::string& tenant, bool must_fit) {
  const std::optional<storage::Quota> quota = quotas_->For(tenant);
  if (!quota) return absl::OkStatus();
  MutexLock lock(mu_);
  if (groups_.contains(tenant)) return absl::OkStatus();
  const auto group = static_cast<storage::QuotaGroup>(groups_.size() + 1);
  KVC_RETURN_IF_ERROR(store_->SetQuota(group, *quota, must_fit));
  groups_.emplace(tenant, group);
  return absl::OkStatus();
}

void QuotaGroups::Assign(const NamespaceInfo& ns) {
  if (!quotas_->For(ns.tenant)) return;
  const absl::Status s = Admit(ns.tenant, /*must_fit=*/false);
  KVC_CHECK(s.ok()) << "quota of tenant " << ns.tenant << ": " << s;
  MutexLock lock(mu_);
  store_->SetQuotaGroup(ns.store_id, groups_.at(ns.tenant));
}

bool QuotaGroups::Describe(const std::string& tenant, kvcache::v1::TenantQuota* out) const {
  const std::optional<storage::Quota> q = quotas_->For(tenant);
  if (!q) return false;
  out->set_ram_bytes_limit(q->ram_bytes);
  out->set_ssd_bytes_limit(q->ssd_bytes);
  out->set_pinned_chunks_limit(q->pinned_chunks);
  out->set_rados_bytes_limit(q->rados_bytes);
  // Fleet-wide: counted in the shared tier itself (one read of its count); nothing
  // without one.
  absl::StatusOr<uint64_t> shared = store_->SharedAccountBytes(SharedAccountOf(tenant));
  if (shared.ok()) {
    out->set_rados_bytes(*shared);
  } else if (!absl::IsFailedPrecondition(shared.status())) {
    out->set_rados_error(std::string(shared.status().message()));
  }
  const storage::ChunkStore::QuotaRoom room = store_->QuotaCapacity();
  out->set_ram_bytes_per_chunk(room.ram_bytes_per_chunk);
  out->set_ssd_bytes_per_chunk(room.ssd_bytes_per_chunk);
  std::optional<storage::QuotaGroup> group;  // none before its first namespace: holds nothing
  {
    MutexLock lock(mu_);
    if (auto it = groups_.find(tenant); it != groups_.end()) group = it->second;
  }
  if (group) {
    const storage::QuotaUsage u = store_->Usage(*group);
    out->set_ram_bytes(u.ram_bytes);
    out->set_ssd_bytes(u.ssd_bytes);
    out->set_pinned_chunks(u.pinned_chunks);
  }
  return true;
}

}  // namespace kvc::cachesvc
