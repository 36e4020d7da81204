// DelayedStart: runs short callbacks at a later time on one thread of its own — the calls a
// CostPacer holds back wait here, taking no executor thread. A callback must not block
// (the service's hand work to the executor). Callbacks still waiting when it is destroyed
// run then, at once, so every held-back call is answered.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <thread>

#include "base/mutex.h"

namespace kvc::cachesvc {

class DelayedStart {
 public:
  using Clock = std::chrono::steady_clock;
  DelayedStart() : thread_([this] { Run(); }) {}
  ~DelayedStart() {
    {
      MutexLock lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  DelayedStart(const DelayedStart&) = delete;
  DelayedStart& operator=(const DelayedStart&) = delete;

  void At(Clock::time_point when, std::function<void()> fn) {
    {
      MutexLock lk(mu_);
      due_.emplace(when, std::move(fn));
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    MutexLock lk(mu_);
    while (true) {
      if (due_.empty()) {
        if (stopping_) return;
        cv_.wait(mu_);
        continue;
      }
      auto first = due_.begin();
      if (!stopping_ && first->first > Clock::now()) {
        cv_.wait_until(mu_, first->first);
        continue;
      }
      std::function<void()> fn = std::move(first->second);
      due_.erase(first);
      lk.unlock();
      fn();
      lk.lock();
    }
  }

  Mutex mu_;
  std::condition_variable_any cv_;
  std::multimap<Clock::time_point, std::function<void()>> due_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts once the state above exists
};

}  // namespace kvc::cachesvc
