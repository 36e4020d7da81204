#include "cachesvc/cost_pacer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {

absl::StatusOr<CostPacer::Clock::duration> CostPacer::Charge(const std::string& tenant,
                                                             uint64_t keys, Clock::time_point now) {
  if (!enabled()) return Clock::duration::zero();
  const auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const Clock::duration burst = seconds(opt_.burst_keys / opt_.keys_per_second);
  MutexLock lk(mu_);
  auto [it, fresh] = due_.try_emplace(tenant, now);
  const Clock::time_point due = std::max(it->second, now);
  const Clock::duration wait = std::max(Clock::duration::zero(), due - now - burst);
  if (wait > opt_.max_delay) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant ", tenant, " is past its Lookup budget of ", opt_.keys_per_second,
                     " keys/s: this call would wait ",
                     std::chrono::duration_cast<std::chrono::milliseconds>(wait).count(),
                     " ms (at most ", opt_.max_delay.count(), " ms); retry later"));
  }
  it->second = due + seconds(static_cast<double>(keys) / opt_.keys_per_second);
  // One entry per tenant that has called: tenants come from the token file (or are the
  // one anonymous tenant), so the map stays as small as that list.
  return wait;
}

}  // namespace kvc::cachesvc
