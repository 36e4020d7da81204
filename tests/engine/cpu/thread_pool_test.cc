// The engine's thread pool: every index of a loop is visited exactly once, by the loop it
// belongs to — also when several threads run loops on one pool at the same time (a Model
// serves many Sequences, one per thread, and every matmul goes through the same pool).
#include "engine/cpu/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvc::cpu {
namespace {

TEST(ThreadPoolTest, VisitsEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 64, 1000}) {
    for (int64_t grain : {1, 4, 100}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LE(0, b);
        EXPECT_LE(e, n);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
    }
  }
}

TEST(ThreadPoolTest, ConcurrentCallersEachGetTheirOwnLoop) {
  // Before the fix a second caller overwrote the first one's loop: the first caller's
  // thread then ran its own function over the second loop's ranges.
  ThreadPool pool(3);
  constexpr int kCallers = 4, kRounds = 300;
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      const int64_t n = 50 + 17 * c;  // each caller's loop has its own length
      for (int round = 0; round < kRounds; ++round) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
          if (b < 0 || e > n) {
            wrong.fetch_add(1);
            return;
          }
          for (int64_t i = b; i < e; ++i) {
            // Some work per index, so that callers' loops overlap.
            volatile double x = 1.0;
            for (int k = 0; k < 200; ++k) x = x * 1.0000001 + 1e-9;
            hits[i].fetch_add(1);
          }
        });
        for (int64_t i = 0; i < n; ++i) {
          if (hits[i].load() != 1) wrong.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ThreadPoolTest, ALoopInsideALoopRunsOnItsCaller) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(10, 1, [&](int64_t ib, int64_t ie) { total.fetch_add(ie - ib); });
    }
  });
  EXPECT_EQ(total.load(), 80);
}

}  // namespace
}  // namespace kvc::cpu
