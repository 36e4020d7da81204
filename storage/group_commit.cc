#include "storage/group_commit.h"

namespace kvc::storage {

absl::Status GroupCommit::Commit(const SlabSet& slabs,
                                 const std::vector<std::pair<ChunkKey, IndexRecord>>& puts) {
  Request me{&slabs, &puts, absl::OkStatus(), false};
  MutexLock lk(mu_);
  queue_.push_back(&me);
  // me.done is written under mu_ by the leader that took this request.
  while (!me.done && leader_active_) cv_.wait(mu_);
  if (me.done) return me.result;
  leader_active_ = true;
  std::vector<Request*> group;
  group.swap(queue_);
  lk.unlock();
  SlabSet all_slabs;
  std::vector<std::pair<ChunkKey, IndexRecord>> all_puts;
  for (Request* r : group) {
    all_slabs.insert(r->slabs->begin(), r->slabs->end());
    all_puts.insert(all_puts.end(), r->puts->begin(), r->puts->end());
  }
  // The index write goes first: it is only a WAL append (no sync), and an entry that
  // names a slot whose bytes never reached the disk is never served (the slot header's
  // sequence and checksums do not match it).
  absl::Status status = index_->Commit(all_puts, {}, /*sync=*/false);
  // Each tier's slabs in one call (sorted by tier, then slab).
  for (auto it = all_slabs.begin(); status.ok() && it != all_slabs.end();) {
    SsdTier* tier = it->first;
    std::set<uint64_t> of_tier;
    for (; it != all_slabs.end() && it->first == tier; ++it) of_tier.insert(it->second);
    status = tier->SyncSlabs(of_tier);
  }
  lk.lock();
  for (Request* r : group) {
    r->result = status;
    r->done = true;
  }
  leader_active_ = false;
  lk.unlock();
  cv_.notify_all();
  return me.result;
}

}  // namespace kvc::storage
