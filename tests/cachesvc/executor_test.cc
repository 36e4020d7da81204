// The executor takes work round-robin across tenants: one tenant's long queue delays
// another tenant's call by one of its own calls per thread, not by its whole queue; a
// tenant's own work keeps its order; the bound counts every tenant's work together.
#include "cachesvc/executor.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvc::cachesvc {
namespace {

// Holds the executor's one thread until Open(): everything submitted meanwhile queues.
class Gate {
 public:
  void Wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }
  void Open() {
    {
      std::lock_guard lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(ExecutorTest, TenantsTakeTurnsAndEachKeepsItsOrder) {
  std::mutex mu;
  std::vector<std::string> ran;
  Gate gate;
  {
    Executor ex(/*threads=*/1, /*max_queue=*/64);
    ASSERT_TRUE(ex.Submit("gate", [&] { gate.Wait(); }));
    auto record = [&](std::string what) {
      return [&, what] {
        std::lock_guard lk(mu);
        ran.push_back(what);
      };
    };
    for (int i = 0; i < 10; ++i)
      ASSERT_TRUE(ex.Submit("flood", record("flood" + std::to_string(i))));
    ASSERT_TRUE(ex.Submit("quiet", record("quiet0")));
    ASSERT_TRUE(ex.Submit("quiet", record("quiet1")));
    ASSERT_TRUE(ex.Submit(record("service")));
    gate.Open();
  }  // the destructor runs what is queued
  ASSERT_EQ(ran.size(), 13u);
  // One turn each: flood, quiet, the service's own, then flood and quiet again.
  EXPECT_EQ(ran[0], "flood0");
  EXPECT_EQ(ran[1], "quiet0");
  EXPECT_EQ(ran[2], "service");
  EXPECT_EQ(ran[3], "flood1");
  EXPECT_EQ(ran[4], "quiet1");
  for (int i = 2; i < 10; ++i) EXPECT_EQ(ran[3 + i], "flood" + std::to_string(i)) << i;
}

TEST(ExecutorTest, TheBoundCountsEveryTenantsWorkTogether) {
  Gate gate;
  std::atomic<int> done{0};
  {
    Executor ex(1, 4);
    Gate started;
    ASSERT_TRUE(ex.Submit("a", [&] {
      started.Open();
      gate.Wait();
    }));
    started.Wait();  // the gate's task runs: nothing of it is queued any more
    int accepted = 0;
    for (int i = 0; i < 10; ++i) accepted += ex.Submit(i % 2 ? "a" : "b", [&] { ++done; });
    EXPECT_EQ(accepted, 4) << "the bound is the two tenants' work together";
    gate.Open();
  }
  EXPECT_EQ(done.load(), 4);
}

}  // namespace
}  // namespace kvc::cachesvc
