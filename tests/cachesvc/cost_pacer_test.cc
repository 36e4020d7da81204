// CostPacer on a clock the test moves: a tenant's calls run at once within its burst, wait
// for their cost at its rate past it, and are refused (uncharged) past max_delay; tenants
// are paced apart; an idle tenant's budget refills. And DelayedStart, where held calls
// wait: in time order, never early, and every one run by the time it is destroyed.
#include "cachesvc/cost_pacer.h"

#include <chrono>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "cachesvc/delayed_start.h"

#include "gtest/gtest.h"

namespace kvc::cachesvc {
namespace {

using std::chrono::milliseconds;
using Clock = CostPacer::Clock;

int64_t Ms(Clock::duration d) { return std::chrono::duration_cast<milliseconds>(d).count(); }

// 1,000 keys/s with a burst of 500 keys (half a second), waits of at most 2 s.
CostPacer Pacer() {
  return CostPacer(CostPacerOptions{
      .keys_per_second = 1000, .burst_keys = 500, .max_delay = milliseconds(2000)});
}

TEST(CostPacerTest, WithoutARateNothingWaits) {
  CostPacer p(CostPacerOptions{});
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 100; ++i) {
    auto wait = p.Charge("a", 1'000'000, t0);
    ASSERT_TRUE(wait.ok());
    EXPECT_EQ(wait->count(), 0);
  }
}

TEST(CostPacerTest, PastTheBurstACallWaitsForItsCostAtTheRate) {
  CostPacer p = Pacer();
  const Clock::time_point t0 = Clock::now();
  // 400 keys: within the burst, paid off at t0 + 400 ms.
  EXPECT_EQ(Ms(*p.Charge("a", 400, t0)), 0);
  // Owed 400 ms ≤ the 500 ms burst: at once; then owed 1,000 ms.
  EXPECT_EQ(Ms(*p.Charge("a", 600, t0)), 0);
  // Owed 1,000 ms: waits until it owes only the burst (500 ms).
  EXPECT_EQ(Ms(*p.Charge("a", 100, t0)), 500);
  // 300 ms later it owes 800 ms: waits 300 ms more.
  EXPECT_EQ(Ms(*p.Charge("a", 1, t0 + milliseconds(300))), 300);
}

TEST(CostPacerTest, ACallThatWouldWaitPastTheBoundIsRefusedAndNotCharged) {
  CostPacer p = Pacer();
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(Ms(*p.Charge("a", 3000, t0)), 0);                      // owes 3 s
  absl::StatusOr<Clock::duration> refused = p.Charge("a", 1, t0);  // would wait 2.5 s
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("tenant a is past its Lookup budget of 1000 keys/s"),
            std::string::npos)
      << refused.status();
  // The refusal took nothing: 600 ms later the wait is 2.5 − 0.6 s, as if it never came.
  EXPECT_EQ(Ms(*p.Charge("a", 1, t0 + milliseconds(600))), 1900);
}

TEST(CostPacerTest, TenantsArePacedApart) {
  CostPacer p = Pacer();
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(Ms(*p.Charge("flood", 2000, t0)), 0);
  EXPECT_EQ(Ms(*p.Charge("flood", 1, t0)), 1500);
  EXPECT_EQ(Ms(*p.Charge("quiet", 1, t0)), 0);
}

TEST(CostPacerTest, AnIdleTenantsBudgetRefillsButDoesNotBank) {
  CostPacer p = Pacer();
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(Ms(*p.Charge("a", 2000, t0)), 0);
  // Paid off at t0 + 2 s; an hour of idling later it gets its burst, no more.
  const Clock::time_point later = t0 + std::chrono::hours(1);
  EXPECT_EQ(Ms(*p.Charge("a", 500, later)), 0);
  EXPECT_EQ(Ms(*p.Charge("a", 500, later)), 0);  // owed 500 ms: still within the burst
  EXPECT_EQ(Ms(*p.Charge("a", 1, later)), 500);  // owed 1 s
}

TEST(DelayedStartTest, RunsEachCallbackInTimeOrderAndNeverEarly) {
  Mutex mu;
  std::vector<std::pair<int, Clock::time_point>> ran;
  const Clock::time_point t0 = Clock::now();
  DelayedStart d;
  for (int i : {3, 1, 2}) {
    d.At(t0 + milliseconds(30 * i), [&, i] {
      MutexLock lk(mu);
      ran.emplace_back(i, Clock::now());
    });
  }
  while (true) {
    {
      MutexLock lk(mu);
      if (ran.size() == 3) break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  MutexLock lk(mu);
  for (size_t k = 0; k < ran.size(); ++k) {
    EXPECT_EQ(ran[k].first, static_cast<int>(k) + 1);
    EXPECT_GE(ran[k].second, t0 + milliseconds(30 * ran[k].first));
  }
}

TEST(DelayedStartTest, WhatIsStillWaitingRunsWhenItIsDestroyed) {
  int ran = 0;
  const Clock::time_point t0 = Clock::now();
  {
    DelayedStart d;
    d.At(t0 + std::chrono::hours(1), [&] { ++ran; });
  }
  EXPECT_EQ(ran, 1);
  EXPECT_LT(Clock::now() - t0, std::chrono::minutes(1));
}

}  // namespace
}  // namespace kvc::cachesvc
