// TaskPool: a few long-lived worker threads for fan-out calls — a cluster client asking
// its nodes at once — so a call does not pay for creating a thread per node.
//
// ParallelFor(n, f) runs f(0) … f(n−1) and returns when all have finished. The calling
// thread claims indices too, from the same counter as the workers: if every worker is busy
// (or blocked in a nested ParallelFor) the caller simply does the work itself, so nesting
// cannot deadlock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace kvc {

class TaskPool {
 public:
  explicit TaskPool(size_t threads) {
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~TaskPool() {
    {
      MutexLock lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void ParallelFor(size_t n, const std::function<void(size_t)>& f) {
    if (n == 0) return;
    if (n == 1 || workers_.empty()) {
      for (size_t i = 0; i < n; ++i) f(i);
      return;
    }
    auto batch = std::make_shared<Batch>(n, f);
    {
      MutexLock lk(mu_);
      for (size_t h = 0; h < std::min(n - 1, workers_.size()); ++h)
        queue_.push_back([batch] { batch->Drain(); });
    }
    cv_.notify_all();
    batch->Drain();
    MutexLock lk(batch->mu);
    while (batch->done != n) batch->all_done.wait(batch->mu);
  }

 private:
  struct Batch {
    Batch(size_t count, const std::function<void(size_t)>& fn) : n(count), f(fn) {}
    // Claims and runs indices until none is left; a latecomer finds none and never calls f.
    void Drain() {
      for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        f(i);
        MutexLock lk(mu);
        if (++done == n) all_done.notify_all();
      }
    }
    const size_t n;
    const std::function<void(size_t)>& f;  // the caller's; it waits until done == n
    std::atomic<size_t> next{0};
    Mutex mu;
    std::condition_variable_any all_done;
    size_t done ABSL_GUARDED_BY(mu) = 0;
  };

  void Work() {
    while (true) {
      std::function<void()> task;
      {
        MutexLock lk(mu_);
        while (!stop_ && queue_.empty()) cv_.wait(mu_);
        if (queue_.empty()) return;  // stopping, nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvc
