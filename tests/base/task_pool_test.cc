// TaskPool: every index runs exactly once, on more than one thread, and a ParallelFor
// nested inside another finishes even when it asks for more work than there are workers.
#include "base/task_pool.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvc {
namespace {

TEST(TaskPoolTest, EveryIndexRunsExactlyOnce) {
  TaskPool pool(4);
  for (size_t n : {0, 1, 2, 7, 100}) {
    std::vector<std::atomic<int>> runs(n);
    pool.ParallelFor(n, [&](size_t i) { runs[i].fetch_add(1); });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << "n " << n << " index " << i;
  }
}

TEST(TaskPoolTest, WorkRunsOnTheWorkersToo) {
  TaskPool pool(3);
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::atomic<int> waiting{0};
  // Four tasks that each wait until all four have started: only possible if the caller
  // and three workers run them at once.
  pool.ParallelFor(4, [&](size_t) {
    {
      std::lock_guard lk(mu);
      threads.insert(std::this_thread::get_id());
    }
    waiting.fetch_add(1);
    while (waiting.load() < 4) std::this_thread::yield();
  });
  EXPECT_EQ(threads.size(), 4u);
}

TEST(TaskPoolTest, NestedCallsFinishWithFewerWorkersThanTasks) {
  TaskPool pool(2);
  std::atomic<int> leaves{0};
  pool.ParallelFor(3, [&](size_t) { pool.ParallelFor(5, [&](size_t) { leaves.fetch_add(1); }); });
  EXPECT_EQ(leaves.load(), 15);
}

}  // namespace
}  // namespace kvc
