// ThreadPool: a fixed set of workers for data-parallel loops (ParallelFor).
//
// The engine splits work by rows or by output columns; how work is split never changes
// what any element computes, so results do not depend on the thread count.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace kvc::cpu {

class ThreadPool {
 public:
  // threads <= 0: one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `grain` long
  // (except the last), using the workers and the calling thread; returns when all are done.
  // Safe to call from several threads at once and from inside fn: while the pool runs one
  // loop, any other runs whole on its caller's thread.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The process-wide pool the engine uses (sized at first use; KVC_THREADS overrides).
  static ThreadPool& Default();

 private:
  void Worker() ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<std::thread> workers_;
  Mutex mu_;
  std::condition_variable_any work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0, chunk_ ABSL_GUARDED_BY(mu_) = 0,
             next_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvc::cpu
