// Executor: a fixed pool of threads with a bounded queue, where the service runs storage
// work so that gRPC's reactor callbacks never block on I/O. Submit refuses work when the
// queue is full (the caller answers RESOURCE_EXHAUSTED) instead of growing without bound.
//
// Work is queued per tenant and taken round-robin across the tenants that have some: a
// tenant with many large calls queued delays another tenant's call by at most one of its
// own calls per thread, not by its whole queue (docs/security.md, "Lookup fairness").
// Within a tenant, work runs in the order it was submitted.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"

namespace kvc::cachesvc {

class Executor {
 public:
  Executor(int threads, size_t max_queue) : max_queue_(max_queue) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
  }
  // Runs what is queued, then stops.
  ~Executor() {
    {
      MutexLock lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `fn` as `tenant`'s work; false when the queue (all tenants together) is full or
  // the executor is stopping.
  [[nodiscard]] bool Submit(const std::string& tenant, std::function<void()> fn) {
    {
      MutexLock lk(mu_);
      if (stopping_ || queued_ >= max_queue_) return false;
      std::deque<std::function<void()>>& q = queues_[tenant];
      if (q.empty()) turn_.push_back(tenant);
      q.push_back(std::move(fn));
      ++queued_;
    }
    cv_.notify_one();
    return true;
  }
  // Work of no tenant (the service's own): a queue of its own in the rotation.
  [[nodiscard]] bool Submit(std::function<void()> fn) {
    return Submit(std::string(), std::move(fn));
  }

 private:
  void Run() {
    MutexLock lk(mu_);
    while (true) {
      while (!stopping_ && queued_ == 0) cv_.wait(mu_);
      if (queued_ == 0) return;  // stopping, and nothing is left
      // The tenant whose turn it is: it goes to the back of the rotation if it has more.
      const std::string tenant = std::move(turn_.front());
      turn_.pop_front();
      auto q = queues_.find(tenant);
      std::function<void()> fn = std::move(q->second.front());
      q->second.pop_front();
      if (q->second.empty()) {
        queues_.erase(q);
      } else {
        turn_.push_back(tenant);
      }
      --queued_;
      lk.unlock();
      fn();
      lk.lock();
    }
  }

  const size_t max_queue_;
  Mutex mu_;
  std::condition_variable_any cv_;
  std::map<std::string, std::deque<std::function<void()>>> queues_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> turn_ ABSL_GUARDED_BY(mu_);  // tenants with work, in turn order
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvc::cachesvc
