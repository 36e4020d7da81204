// Tombstones: what a cluster node remembers of the chunks its tenants deleted, so that a
// Delete stays deleted while a node that missed it (away, partitioned) comes back with its
// old copies (docs/cluster.md, "Deletes").
//
// A tombstone is (store_id, stored key) → when it was deleted, kept for `keep_s` seconds
// (kvcached --tombstone-seconds): the longest a node may stay away and come back with its
// data folder. While it lives, a peer's copy of that chunk (Replicate) and a client's
// read-repair copy (StoreRequest.repair_copy) are refused, and Holds and Lookup tell the
// asker the chunk was deleted: the returning node's repair then erases its own copy (and
// keeps a tombstone of its own), and cluster clients treat the chunk as missing. A tenant's
// own Store of the key clears it: storing again is a newer decision than the delete.
//
// Kept in DATA_DIR/tombstones.log, an append-only log of fixed 32-byte records (synced per
// Add), compacted at open; at most `max_entries` live at once (the oldest go first, and the
// count dropped early is logged). Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "base/mutex.h"

namespace kvc::cachesvc {

class Tombstones {
 public:
  struct Options {
    int64_t keep_s = 7 * 24 * 3600;
    size_t max_entries = 1 << 20;
    std::function<int64_t()> now_s;  // wall clock, seconds; tests inject one
  };
  static absl::StatusOr<std::unique_ptr<Tombstones>> Open(const std::string& data_dir,
                                                          Options options);
  ~Tombstones();

  // Records that these stored keys of namespace `store_id` were deleted now. Internal error
  // naming the file when the log cannot be written and synced.
  absl::Status Add(uint32_t store_id, std::span<const storage::ChunkKey> stored);
  // Whether the key has a live tombstone (false at once when there are none).
  bool Deleted(uint32_t store_id, const storage::ChunkKey& stored) const;
  // The key was stored anew by its tenant: forget its tombstone (if any).
  absl::Status Clear(uint32_t store_id, const storage::ChunkKey& stored);
  size_t size() const;
  uint64_t dropped_early() const;  // live tombstones dropped for max_entries, since open

 private:
  struct Id {
    uint32_t store_id;
    storage::ChunkKey key;
    bool operator==(const Id&) const = default;
  };
  struct IdHash {
    size_t operator()(const Id& id) const {
      return storage::ChunkKeyHash()(id.key) ^
             (static_cast<size_t>(id.store_id) * 0x9E3779B97F4A7C15ull);
    }
  };
  Tombstones(std::string path, Options o) : path_(std::move(path)), opt_(std::move(o)) {}
  absl::Status Load();
  absl::Status AppendRecords(const std::string& bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InsertLocked(const Id& id, int64_t at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const Options opt_;
  mutable Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  std::unordered_map<Id, int64_t, IdHash> live_ ABSL_GUARDED_BY(mu_);  // → deleted at (unix s)
  // By time of deletion; an entry whose id was cleared or deleted again since is stale.
  std::deque<std::pair<int64_t, Id>> order_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_early_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvc::cachesvc
