// SharedSweeper: removes the shared tier's chunks past their TTL every interval
// (kvcached --rados-sweep-seconds). A chunk whose TTL has passed is a miss when read, and
// removed then; one nobody reads again would stay in the pool for good without a sweep.
// Every node may sweep (a chunk two sweeps find is removed once, its bytes leave its
// account once); one sweeping node is enough for a fleet (docs/rados.md, "Expiry").
#pragma once

#include <chrono>
#include <condition_variable>
#include <thread>

#include "base/mutex.h"
#include "storage/chunk_store.h"

namespace kvc::cachesvc {

class SharedSweeper {
 public:
  // Sweeps `store`'s shared tier every `interval`, the first one interval after the start.
  SharedSweeper(storage::ChunkStore* store, std::chrono::milliseconds interval);
  // Stops, waiting for a sweep under way to end.
  ~SharedSweeper();
  SharedSweeper(const SharedSweeper&) = delete;
  SharedSweeper& operator=(const SharedSweeper&) = delete;

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  storage::ChunkStore* const store_;
  const std::chrono::milliseconds interval_;
  Mutex mu_;
  std::condition_variable_any stop_changed_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvc::cachesvc
