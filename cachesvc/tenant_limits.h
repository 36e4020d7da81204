// TenantLimiter: how many calls each tenant may have in flight at once.
//
// Every call holds a slot from authentication until it finishes (a Fetch or Store stream
// for its whole life), so one tenant's many clients, or clients that stop reading, cannot
// take every executor thread and stream from the others: past its limit a tenant gets
// RESOURCE_EXHAUSTED while other tenants are served as before.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include "base/mutex.h"

#include "absl/status/statusor.h"

namespace kvc::cachesvc {

class TenantLimiter {
 public:
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept : limiter_(o.limiter_), tenant_(std::move(o.tenant_)) {
      o.limiter_ = nullptr;
    }
    Slot& operator=(Slot&& o) noexcept;
    ~Slot() { Release(); }
    const std::string& tenant() const { return tenant_; }
    // Gives the slot back now (before the call's answer goes out, so that a client's next
    // call never finds it still taken); idempotent.
    void Release();

   private:
    friend class TenantLimiter;
    Slot(TenantLimiter* l, std::string t) : limiter_(l), tenant_(std::move(t)) {}
    TenantLimiter* limiter_ = nullptr;
    std::string tenant_;
  };

  explicit TenantLimiter(uint32_t max_calls_per_tenant) : max_(max_calls_per_tenant) {}
  // A slot for one more call of `tenant`, or RESOURCE_EXHAUSTED naming the limit.
  absl::StatusOr<Slot> Acquire(const std::string& tenant);
  uint32_t InFlight(const std::string& tenant) const;

 private:
  const uint32_t max_;
  mutable Mutex mu_;
  std::unordered_map<std::string, uint32_t> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::cachesvc
