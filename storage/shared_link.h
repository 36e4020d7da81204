// SharedTierLink: a store's link to its shared tier (shared_tier.h) — how durable puts
// reach it (written through before the put is acknowledged, or written behind from a
// bounded backlog), and the counts StoreStats reports. ChunkStore calls it outside its
// own lock: the shared tier is a network away.
//
// Write-behind: a durable put is acknowledged once on the node's SSD; a copy of its bytes
// waits in the backlog (at most backlog_max_bytes; past that a put is written through, so
// the backlog is bounded and nothing is dropped) and one writer thread sends it in
// batches, retrying while the tier does not answer. A node that dies loses its backlog:
// those chunks stay on its SSD only (docs/rados.md, "Durability").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "storage/shared_tier.h"

namespace kvc::storage {

class SharedTierLink {
 public:
  SharedTierLink(std::shared_ptr<SharedTier> tier, bool write_behind, uint64_t backlog_max_bytes,
                 double retry_after_s = 5);
  // Stops the writer after it has sent the backlog (or failed a round at it).
  ~SharedTierLink();
  SharedTierLink(const SharedTierLink&) = delete;
  SharedTierLink& operator=(const SharedTierLink&) = delete;

  // Durable puts the node has stored: written now (one status each), or queued (OK).
  std::vector<absl::Status> Store(std::span<const SharedPut> puts) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<absl::Status> Fetch(SharedTag ns, std::span<const ChunkKey> keys,
                                  std::span<const std::span<uint8_t>> outs,
                                  std::vector<SharedChunk>* metas) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<absl::StatusOr<bool>> Contains(std::span<const ChunkKey> keys)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops queued copies of the keys (waiting for any being written), then removes them.
  std::vector<absl::Status> Remove(std::span<const ChunkKey> keys) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the backlog is empty, or the timeout passes (DeadlineExceeded).
  absl::Status Drain(std::chrono::milliseconds timeout) ABSL_LOCKS_EXCLUDED(mu_);
  SharedTierStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  bool write_behind() const { return write_behind_; }
  // The namespace's tag in the shared tier (ChunkStore::SetSharedTag) and the account its
  // bytes count against (empty: none); one never set is named by its store id; tag 0: the
  // namespace stays off the shared tier.
  void SetTag(NamespaceId ns, SharedTag tag, std::string account) ABSL_LOCKS_EXCLUDED(mu_);
  struct Share {
    SharedTag tag = 0;
    std::string account;
  };
  Share ShareOf(NamespaceId ns) const ABSL_LOCKS_EXCLUDED(mu_);
  SharedTag TagOf(NamespaceId ns) const ABSL_LOCKS_EXCLUDED(mu_) { return ShareOf(ns).tag; }
  // The account's bytes in the shared tier, with those waiting in the backlog.
  absl::StatusOr<uint64_t> AccountBytes(const std::string& account) ABSL_LOCKS_EXCLUDED(mu_);
  // SharedTier::SweepExpired, counted in Stats.
  absl::StatusOr<SharedSweep> Sweep(int64_t now_s) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    ChunkKey key;
    SharedChunk meta;
    std::vector<uint8_t> bytes;
  };
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Counts an operation's outcome: reachable, or not and why (then calls skip the tier
  // for retry_after_s).
  void Note(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  // While the tier is not answering (a failure less than retry_after_s ago): the error
  // to answer at once, naming the last failure; OK when a call may ask it.
  absl::Status Skipping() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<SharedTier> tier_;
  const bool write_behind_;
  const uint64_t backlog_max_bytes_;
  const std::chrono::steady_clock::duration retry_after_;
  std::chrono::steady_clock::time_point down_until_ ABSL_GUARDED_BY(mu_);
  mutable Mutex mu_;
  std::condition_variable_any changed_;  // the backlog or in_flight_ changed, or stop_
  std::deque<Queued> backlog_ ABSL_GUARDED_BY(mu_);
  uint64_t backlog_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ChunkKey> in_flight_ ABSL_GUARDED_BY(mu_);  // taken by the writer, being sent
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  SharedTierStats stats_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<NamespaceId, Share> shares_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace kvc::storage
