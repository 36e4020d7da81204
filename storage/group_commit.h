// GroupCommit: makes written slots durable and commits their index entries for all
// concurrent callers at once. The first caller to arrive leads: it takes every request
// queued so far and, at the same time, fdatasyncs each slab they touched once and commits
// all their records in one RocksDB write (WAL synced if any of them asked); when both are
// done it wakes the others. Callers arriving meanwhile form the next group. The index
// entry may reach the disk before its data: slots are self-checking (header sequence,
// checksums), so such an entry is never served (group_commit.cc says why that is safe).
// Thread-safe; never called with the store's mutex held.
#pragma once

#include <condition_variable>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "storage/chunk_index.h"
#include "storage/ssd_tier.h"

namespace kvc::storage {

class GroupCommit {
 public:
  GroupCommit(SsdTier* ssd, ChunkIndex* index) : ssd_(ssd), index_(index) {}

  // The slabs' sync or the commit's error, for every caller of the group.
  [[nodiscard]] absl::Status Commit(const std::set<uint64_t>& slabs,
                                    const std::vector<std::pair<ChunkKey, IndexRecord>>& puts,
                                    bool sync_index);

 private:
  struct Request {
    const std::set<uint64_t>* slabs;
    const std::vector<std::pair<ChunkKey, IndexRecord>>* puts;
    bool sync_index;
    absl::Status result;
    bool done = false;
  };
  SsdTier* ssd_;
  ChunkIndex* index_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Request*> queue_;
  bool leader_active_ = false;
};

}  // namespace kvc::storage
