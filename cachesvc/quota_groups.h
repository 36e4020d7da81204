// QuotaGroups: each tenant with a quota (tenant_quotas.h) gets one quota group in the chunk
// store at its first namespace, shared by all of its namespaces, so its guaranteed share is
// charged and protected as one (storage/quota.h). Thread-safe.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "base/mutex.h"
#include "cachesvc/namespace_registry.h"
#include "cachesvc/tenant_quotas.h"
#include "kvcache/v1/kvcache.pb.h"
#include "storage/chunk_store.h"

namespace kvc::cachesvc {

class QuotaGroups {
 public:
  QuotaGroups(storage::ChunkStore* store, const TenantQuotas* quotas)
      : store_(store), quotas_(quotas) {}

  // The tenant's group, made at its first namespace. With must_fit, ResourceExhausted when
  // its guaranteed share does not fit beside the others' (storage's SetQuota); without
  // (namespaces registered before a restart, whose quotas were admitted then), it is set
  // whatever the sum — a guarantee that cannot be kept then fails stores rather than
  // evicting another tenant. OK for a tenant without a quota.
  absl::Status Admit(const std::string& tenant, bool must_fit);
  // Puts the namespace in its tenant's group (admitting the group if needed).
  void Assign(const NamespaceInfo& ns);
  // The tenant's quota and what it holds against it; false without a quota.
  bool Describe(const std::string& tenant, kvcache::v1::TenantQuota* out) const;

 private:
  storage::ChunkStore* const store_;
  const TenantQuotas* const quotas_;
  mutable Mutex mu_;
  std::map<std::string, storage::QuotaGroup> groups_ ABSL_GUARDED_BY(mu_);  // per tenant
};

}  // namespace kvc::cachesvc
