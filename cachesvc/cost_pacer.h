// CostPacer: what each tenant's calls cost the server, paced against a rate per tenant.
//
// A tenant's Lookup names up to 65,536 keys; on a small node a few clients looping on such
// calls keep every core busy, and another tenant's one-key Lookup then waits for a core at
// every thread hop — a fair queue cannot help, the queue is not where it waits
// (docs/security.md, "Lookup fairness"). So each tenant is charged what its calls cost (in
// keys) against `keys_per_second`, with a burst of `burst_keys`: a call within the budget
// runs at once, a call past it is held back until the budget has refilled (it does not
// take a thread meanwhile), and one that would wait longer than `max_delay` is refused
// (RESOURCE_EXHAUSTED naming the rate and the wait). A tenant's clients that wait for their
// answers are thereby slowed to its rate, and the cores stay free for the others.
//
// The accounting is a virtual clock per tenant (GCRA): `due` is when the tenant's charged
// work would be paid off at its rate; a call may start once due − now ≤ burst time.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "base/mutex.h"

namespace kvc::cachesvc {

struct CostPacerOptions {
  double keys_per_second = 0;  // per tenant; 0 = no pacing
  double burst_keys = 0;       // charged at once before pacing starts
  std::chrono::milliseconds max_delay{1000};
};

class CostPacer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CostPacer(CostPacerOptions o) : opt_(o) {}
  bool enabled() const { return opt_.keys_per_second > 0; }
  const CostPacerOptions& options() const { return opt_; }

  // Charges `keys` to the tenant at `now`: how long the call must wait before it runs (zero
  // within the budget), or RESOURCE_EXHAUSTED when that would be more than max_delay (and
  // nothing is charged).
  absl::StatusOr<Clock::duration> Charge(const std::string& tenant, uint64_t keys,
                                         Clock::time_point now = Clock::now());

 private:
  const CostPacerOptions opt_;
  Mutex mu_;
  // When each tenant's charged work is paid off (in the past for an idle tenant).
  std::unordered_map<std::string, Clock::time_point> due_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::cachesvc
