#include "cachesvc/tenant_limits.h"

#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {

TenantLimiter::Slot& TenantLimiter::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    Release();
    limiter_ = std::exchange(o.limiter_, nullptr);
    tenant_ = std::move(o.tenant_);
  }
  return *this;
}

void TenantLimiter::Slot::Release() {
  if (limiter_ == nullptr) return;
  MutexLock lk(limiter_->mu_);
  auto it = limiter_->in_flight_.find(tenant_);
  if (--it->second == 0) limiter_->in_flight_.erase(it);
  limiter_ = nullptr;
}

absl::StatusOr<TenantLimiter::Slot> TenantLimiter::Acquire(const std::string& tenant) {
  MutexLock lk(mu_);
  uint32_t& n = in_flight_[tenant];
  if (n >= max_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant \"", tenant, "\" has ", n, " calls in flight; the limit is ", max_));
  }
  ++n;
  return Slot(this, tenant);
}

uint32_t TenantLimiter::InFlight(const std::string& tenant) const {
  MutexLock lk(mu_);
  auto it = in_flight_.find(tenant);
  return it == in_flight_.end() ? 0 : it->second;
}

}  // namespace kvc::cachesvc
