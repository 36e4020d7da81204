// TenantCounters: what Stats tells a tenant about its own fetches (hits per tier, misses),
// counted per tenant by the fetch paths. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "base/mutex.h"

namespace kvc::cachesvc {

class TenantCounters {
 public:
  struct Counts {
    uint64_t ram_hits = 0, ssd_hits = 0, misses = 0;
  };
  void Add(const std::string& tenant, uint64_t ram_hits, uint64_t ssd_hits, uint64_t misses);
  Counts Of(const std::string& tenant) const;

 private:
  mutable Mutex mu_;
  std::map<std::string, Counts> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::cachesvc
