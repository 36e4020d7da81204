#include "engine/cpu/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace kvc::cpu {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Worker(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool pool([] {
    const char* env = std::getenv("KVC_THREADS");
    return env ? std::atoi(env) : 0;
  }());
  return pool;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t parts = std::min<int64_t>(size(), (n + grain - 1) / grain);
  if (parts <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  MutexLock lk(mu_);
  if (fn_ != nullptr) {
    // The pool runs one loop at a time. Another thread's loop holds it (a Model serves a
    // Sequence per thread), or this is a loop inside one of its ranges: run this one
    // here, whole — the split never changes a result, and waiting could deadlock.
    lk.unlock();
    fn(0, n);
    return;
  }
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + parts - 1) / parts;
  next_ = 0;
  pending_ = static_cast<int>((n + chunk_ - 1) / chunk_);
  ++generation_;
  work_cv_.notify_all();
  // The caller takes ranges too.
  while (next_ < n_) {
    const int64_t b = next_;
    next_ = std::min(n_, b + chunk_);
    const int64_t e = next_;
    lk.unlock();
    fn(b, e);
    lk.lock();
    --pending_;
  }
  while (pending_ != 0) done_cv_.wait(mu_);
  fn_ = nullptr;
}

void ThreadPool::Worker() {
  uint64_t seen = 0;
  MutexLock lk(mu_);
  while (true) {
    while (!stop_ && (generation_ == seen || fn_ == nullptr)) work_cv_.wait(mu_);
    if (stop_) return;
    seen = generation_;
    while (fn_ != nullptr && next_ < n_) {
      const int64_t b = next_;
      next_ = std::min(n_, b + chunk_);
      const int64_t e = next_;
      const auto* fn = fn_;
      lk.unlock();
      (*fn)(b, e);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

}  // namespace kvc::cpu
