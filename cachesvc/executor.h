// Executor: a fixed pool of threads with a bounded queue, where the service runs storage
// work so that gRPC's reactor callbacks never block on I/O. Submit refuses work when the
// queue is full (the caller answers RESOURCE_EXHAUSTED) instead of growing without bound.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvc::cachesvc {

class Executor {
 public:
  Executor(int threads, size_t max_queue) : max_queue_(max_queue) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
  }
  // Runs what is queued, then stops.
  ~Executor() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  [[nodiscard]] bool Submit(std::function<void()> fn) {
    {
      std::lock_guard lk(mu_);
      if (stopping_ || queue_.size() >= max_queue_) return false;
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
    return true;
  }

 private:
  void Run() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      fn();
      lk.lock();
    }
  }

  const size_t max_queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvc::cachesvc
