// GroupCommit: makes written slots durable and commits their index entries for all
// concurrent callers at once. The first caller to arrive leads: it takes every request
// queued so far, commits all their index records in one RocksDB write (not synced) and
// fdatasyncs each slab they touched once; then it wakes the others. Callers arriving
// meanwhile form the next group. The slab sync is the durability point: the records reach
// the disk with the next synced index commit, and a crash before that is repaired from the
// slots themselves (slot_reservation.h). Thread-safe; never called with the store's mutex held.
#pragma once

#include <condition_variable>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "base/mutex.h"
#include "storage/chunk_index.h"
#include "storage/ssd_tier.h"

namespace kvc::storage {

class GroupCommit {
 public:
  explicit GroupCommit(ChunkIndex* index) : index_(index) {}

  // Slabs to sync: each a tier (a size class's) and a slab of it.
  using SlabSet = std::set<std::pair<SsdTier*, uint64_t>>;
  // The commit's or the slabs' sync's error, for every caller of the group.
  [[nodiscard]] absl::Status Commit(const SlabSet& slabs,
                                    const std::vector<std::pair<ChunkKey, IndexRecord>>& puts);

 private:
  struct Request {
    const SlabSet* slabs;
    const std::vector<std::pair<ChunkKey, IndexRecord>>* puts;
    absl::Status result;
    bool done = false;
  };
  ChunkIndex* index_;
  Mutex mu_;
  std::condition_variable_any cv_;
  std::vector<Request*> queue_ ABSL_GUARDED_BY(mu_);
  bool leader_active_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvc::storage
