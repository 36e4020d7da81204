// ClusterRepair: a cluster node's anti-entropy (docs/cluster.md, "Repair"). After the
// membership changes and then holds still for a grace period — a node gone for good, a
// node joined — and at least every `interval_s` besides, the node walks every chunk it
// holds, computes each chunk's owners under the current membership (kvcache-rendezvous-v1
// over the client's key, which the store keeps beside the chunk: ChunkOrigin), asks the
// owners which of them hold it (ClusterPeer.Holds), and copies it, node to node, to the
// owners that lack it (ClusterPeer.Replicate) — without any client reading it.
//
// Who copies: a chunk's best-ranked owner that holds it; a node that holds a chunk it does
// not own copies only when no owner holds one (a copy left behind by a join or a failed
// store); a draining node copies everything to every owner that lacks it. Copies are
// idempotent (a chunk's bytes follow from its key), so two nodes copying the same chunk
// waste bandwidth and nothing else. A pass is resumable by construction: a pass cut short
// (a restart, a membership change) is followed by one that asks again, and only the
// copies still missing are made. Bandwidth is bounded by `bytes_per_s`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "base/mutex.h"
#include "cachesvc/namespace_registry.h"
#include "cachesvc/tombstones.h"
#include "cluster/membership.h"
#include "kvcache/v1/kvcache.pb.h"
#include "storage/chunk_store.h"

namespace kvc::cachesvc {

struct RepairOptions {
  std::string self_id;
  size_t replicas = 2;              // R: must match the clients' (ClientOptions::replicas)
  double grace_s = 30;              // the membership unchanged this long before a pass
  double interval_s = 600;          // and a pass at least this often (0: only on changes)
  uint64_t bytes_per_s = 0;         // copy bandwidth (payload bytes); 0: unbounded
  std::string secret;               // the cluster credential sent to peers (may be empty)
  std::string tls_roots_pem;        // non-empty: peers are dialled over TLS with these roots
  size_t max_copy_bytes = 4 << 20;  // payload bytes per Replicate call
  // A copy this node holds of a chunk it does not own is dropped once every owner says it
  // holds one (false: kept as an extra copy until eviction takes it).
  bool drop_extra_copies = false;
  uint64_t shard_chunks = 1 << 18;  // a pass lists about this many chunks at a time
  // This node's tombstones (not owned; null: none): an owner that says a chunk was deleted
  // there makes this node erase its own copy and remember the delete too, instead of
  // copying the chunk back (docs/cluster.md, "Deletes").
  Tombstones* tombstones = nullptr;
  std::function<void(const std::string& event, const std::string& detail)> log;
};

// What repair has found and done: the StatsResponse field itself (kvcache.proto:
// RepairStats, whose comments say what each count means), kept in that form so Stats,
// the metrics and kvctl read it as is. under_replicated_* count only the chunks this node
// is the copier of (see above), so the cluster's sum counts each short chunk once.
using RepairStats = ::kvcache::v1::RepairStats;

class ClusterRepair {
 public:
  // Starts the background thread, which watches the membership through `view`.
  ClusterRepair(RepairOptions options, storage::ChunkStore* store, NamespaceRegistry* registry,
                std::unique_ptr<cluster::MembershipView> view);
  ~ClusterRepair();

  RepairStats stats() const;

  // Hands this node's chunks over as if it had left: every chunk goes to each of its owners
  // under the membership without this node that lacks it. Runs in the caller's thread (the
  // background passes stop first); OK when every copy was made. Call it while the node is
  // still registered (its copies stay readable meanwhile), leave, and call it again for
  // what arrived in between.
  absl::Status Drain();

 private:
  struct Pass;
  void Loop();
  // One pass over `members` (this node among them or not); Aborted when `stop` turns true
  // or (unless draining) the membership changes.
  absl::Status RunPass(const std::vector<cluster::NodeInfo>& members, bool draining,
                       uint64_t membership_version);
  bool ShouldStop(bool draining, uint64_t membership_version) const;

  RepairOptions opt_;
  storage::ChunkStore* store_;
  NamespaceRegistry* registry_;
  std::unique_ptr<cluster::MembershipView> view_;
  class Peers;
  std::unique_ptr<Peers> peers_;

  Mutex pass_mu_;  // one pass at a time (the background's or a drain's)
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  RepairStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvc::cachesvc
