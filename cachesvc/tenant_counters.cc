#include "cachesvc/tenant_counters.h"

namespace kvc::cachesvc {

void TenantCounters::Add(const std::string& tenant, uint64_t ram_hits, uint64_t ssd_hits,
                         uint64_t misses) {
  MutexLock lock(mu_);
  Counts& c = counts_[tenant];
  c.ram_hits += ram_hits;
  c.ssd_hits += ssd_hits;
  c.misses += misses;
}

TenantCounters::Counts TenantCounters::Of(const std::string& tenant) const {
  MutexLock lock(mu_);
  auto it = counts_.find(tenant);
  return it == counts_.end() ? Counts{} : it->second;
}

}  // namespace kvc::cachesvc
