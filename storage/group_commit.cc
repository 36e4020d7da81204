#include "storage/group_commit.h"

#include <thread>

namespace kvc::storage {

absl::Status GroupCommit::Commit(const std::set<uint64_t>& slabs,
                                 const std::vector<std::pair<ChunkKey, IndexRecord>>& puts,
                                 bool sync_index) {
  Request me{&slabs, &puts, sync_index, absl::OkStatus(), false};
  std::unique_lock lk(mu_);
  queue_.push_back(&me);
  cv_.wait(lk, [&] { return me.done || !leader_active_; });
  if (me.done) return me.result;
  leader_active_ = true;
  std::vector<Request*> group;
  group.swap(queue_);
  lk.unlock();
  std::set<uint64_t> all_slabs;
  std::vector<std::pair<ChunkKey, IndexRecord>> all_puts;
  bool sync = false;
  for (Request* r : group) {
    all_slabs.insert(r->slabs->begin(), r->slabs->end());
    all_puts.insert(all_puts.end(), r->puts->begin(), r->puts->end());
    sync |= r->sync_index;
  }
  // The slabs' fdatasync and the index commit (its WAL sync) run at once, not one after
  // the other: the caller is answered when both are done, so a durable batch waits for
  // one sync's time, not two. An index entry that reaches the disk before its data (a crash
  // between the two) names a slot whose header sequence and checksum do not match it, so
  // the chunk is never served and the open keeps the newer of two entries on one slot
  // (chunk_store_open.cc); nothing acknowledged depends on that order.
  absl::Status data_status;
  std::thread data_sync([&] { data_status = ssd_->SyncSlabs(all_slabs); });
  absl::Status status = index_->Commit(all_puts, {}, sync);
  data_sync.join();
  if (!data_status.ok()) status = data_status;
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
