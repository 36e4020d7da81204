#include "cachesvc/shared_sweeper.h"

#include "cachesvc/log.h"

namespace kvc::cachesvc {

SharedSweeper::SharedSweeper(storage::ChunkStore* store, std::chrono::milliseconds interval)
    : store_(store), interval_(interval) {
  thread_ = std::thread([this] { Loop(); });
}

SharedSweeper::~SharedSweeper() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  stop_changed_.notify_all();
  thread_.join();
}

void SharedSweeper::Loop() {
  while (true) {
    {
      MutexLock lk(mu_);
      const auto until = std::chrono::steady_clock::now() + interval_;
      while (!stop_ && std::chrono::steady_clock::now() < until)
        stop_changed_.wait_until(mu_, until);
      if (stop_) return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const absl::StatusOr<storage::SharedSweep> swept = store_->SweepSharedTier();
    const double took_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (swept.ok()) {
      LogLine(LogLevel::kInfo, "shared_tier_swept")
          .Int("listed", static_cast<int64_t>(swept->listed))
          .Int("removed", static_cast<int64_t>(swept->removed))
          .Int("errors", static_cast<int64_t>(swept->errors))
          .Num("seconds", took_s);
    } else {
      LogLine(LogLevel::kWarn, "shared_tier_sweep_failed").Str("error", swept.status().message());
    }
  }
}

}  // namespace kvc::cachesvc
