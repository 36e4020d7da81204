// ClusterClient: the cache as many kvcached nodes whose membership is in etcd
// (docs/cluster.md). Every chunk lives on its R best-ranked nodes by rendezvous hashing
// (cluster/placement.h); the client computes the ranking itself and talks to the nodes
// directly, all of them in parallel:
// - Lookup asks each chunk's R owners and the next few ranked nodes (lookup_extra_nodes)
//   which of them hold it, every member while the cluster is unsettled (a membership change
//   within the repair grace period, repairs queued), and merges: the prefix is the leading
//   run of chunks that some node holds.
// - Fetch pulls each chunk from its best-ranked holder, every node's share at once; a node
//   that fails or misses a chunk is skipped and the next one in the ranking is asked.
// - Store writes each chunk to its R owners and is acknowledged when all R have it (with
//   the durability asked for); an owner that fails is replaced by the next in the ranking.
// - Repair: a chunk that a Lookup finds on fewer than R nodes, once the membership has
//   been stable for a grace period, is copied to its missing owners in the background.
// Membership comes from a watch on etcd; when etcd is unreachable the client keeps the
// last membership it saw and says it is stale (membership()). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/task_pool.h"
#include "client/cache_api.h"
#include "client/client.h"
#include "cluster/membership.h"

namespace kvc::client {

struct NodeStats;

class ClusterClient final : public CacheApi {
  using Clock = std::chrono::steady_clock;

 public:
  // `options.address`: "etcd://H:P[,H:P…]". Fails if etcd does not answer.
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(const ClientOptions& options);
  ~ClusterClient() override;

  absl::StatusOr<RemoteNamespace> RegisterNamespace(const std::string& model_config_json,
                                                    const std::string& model_id,
                                                    uint32_t chunk_tokens = 0) override;
  // A caller-keyed namespace on every node (CacheClient::RegisterKeyedNamespace).
  absl::StatusOr<RemoteNamespace> RegisterKeyedNamespace(const std::string& model_id,
                                                         uint64_t page_bytes,
                                                         uint32_t page_tokens = 0) override;
  absl::StatusOr<LookupResult> Lookup(const RemoteNamespace& ns,
                                      std::span<const uint32_t> tokens) override;
  // Lookup by keys the caller holds (a caller-keyed namespace's, or an earlier turn's).
  // Repairs chunks it finds short of R copies in a caller-keyed namespace; in a token one
  // only Lookup (which has the tokens a copy is stored with) repairs.
  absl::StatusOr<LookupResult> LookupKeys(const RemoteNamespace& ns,
                                          std::span<const storage::ChunkKey> keys) override;
  absl::StatusOr<size_t> Fetch(const RemoteNamespace& ns, std::span<const storage::ChunkKey> keys,
                               std::span<uint8_t> out,
                               std::string* short_reason = nullptr) override;
  // `stored` and `already_present` count copies (up to R per chunk).
  absl::StatusOr<StoreResult> Store(const RemoteNamespace& ns,
                                    std::optional<storage::ChunkKey> parent,
                                    std::span<const uint32_t> tokens,
                                    std::span<const uint8_t> payloads,
                                    Durability durability = Durability::kDurable,
                                    uint32_t ttl_seconds = 0) override;
  // Chunks that name their own parent (token namespaces) or their own key (caller-keyed
  // ones, CallerKey), each to its R owners; counts copies like Store.
  absl::StatusOr<StoreResult> StoreChunks(const RemoteNamespace& ns,
                                          std::span<const ChunkToStore> chunks,
                                          Durability durability = Durability::kDurable,
                                          uint32_t ttl_seconds = 0) override;
  // Pin, Unpin and Delete go to every node and count copies.
  absl::StatusOr<uint32_t> Pin(const RemoteNamespace& ns, std::span<const storage::ChunkKey> keys,
                               uint32_t ttl_seconds) override;
  absl::StatusOr<uint32_t> Unpin(const RemoteNamespace& ns,
                                 std::span<const storage::ChunkKey> keys) override;
  absl::StatusOr<uint32_t> Delete(const RemoteNamespace& ns,
                                  std::span<const storage::ChunkKey> keys) override;

  using Membership = cluster::MembershipView::Snapshot;
  std::shared_ptr<const Membership> membership() const { return view_->Current(); }
  // Copies per chunk with the current membership.
  uint32_t replicas() const;
  // The owners of `key` (node ids, best first) under the current membership: its first
  // replicas() ranked nodes.
  std::vector<std::string> Owners(const storage::ChunkKey& key) const;

  // What this client did, per node id.
  struct NodeCounters {
    uint64_t chunks_fetched = 0;  // chunks this node served
    uint64_t chunks_stored = 0;   // copies written to it
    uint64_t failures = 0;        // calls that failed (the node was then skipped)
  };
  struct Counters {
    std::map<std::string, NodeCounters> nodes;
    uint64_t fetch_failovers = 0;  // chunks fetched from other than the first node asked
    uint64_t chunks_repaired = 0;  // copies made to bring chunks back to R
    // Lookup's fan-out: calls made and keys asked in all, over `lookups` lookups, of which
    // `wide_lookups` asked every member (the cluster was unsettled).
    uint64_t lookups = 0, wide_lookups = 0, lookup_nodes_asked = 0, lookup_keys_asked = 0;
  };
  Counters counters() const;

  // Every member's Stats, in parallel (NodeStats: client/stats.h).
  std::vector<NodeStats> Stats();

 public:
  struct Node;  // a member's connection (cluster_client.cc)

 private:
  explicit ClusterClient(ClientOptions o) : options_(std::move(o)) {}
  // Handles for the current members, by id (clients are made on first sight of a node and
  // made again when its address or generation changes).
  std::vector<std::shared_ptr<Node>> Members();
  // The node knows `ns` (registered there on first use, with the same id everywhere).
  absl::Status EnsureNamespace(Node& node, const RemoteNamespace& ns);
  void MarkFailed(Node& node, const absl::Status& why);
  bool Skipped(const Node& node) const;
  uint32_t ReplicasFor(size_t members) const;
  // Repairs: chunks to copy from a holder to the owners that lack them.
  struct RepairJob {
    RemoteNamespace ns;
    std::optional<storage::ChunkKey> parent;
    std::vector<uint32_t> tokens;  // a caller-keyed namespace: none (stored by its key)
    storage::ChunkKey key;
    std::string from;
    std::vector<std::string> to;
  };
  // How a namespace is registered on a node (again after a restart, on a node that joins).
  using Registrar = std::function<absl::StatusOr<RemoteNamespace>(CacheClient&)>;
  absl::StatusOr<RemoteNamespace> Register(const Registrar& registrar);
  // Lookup of `keys`; `tokens` (whole chunks, as many as keys; empty: not known) let a
  // token namespace's short chunks be repaired.
  absl::StatusOr<LookupResult> LookupImpl(const RemoteNamespace& ns,
                                          std::vector<storage::ChunkKey> keys,
                                          std::span<const uint32_t> tokens);
  absl::StatusOr<StoreResult> StoreOnOwners(const RemoteNamespace& ns,
                                            std::span<const ChunkToStore> chunks,
                                            std::span<const storage::ChunkKey> keys,
                                            Durability durability, uint32_t ttl_seconds);
  void RepairLoop();
  void Repair(const RepairJob& job);

  ClientOptions options_;
  // This client's pick among a chunk's copies (cluster::FirstHolder): random per client.
  const std::string read_salt_ = RandomSalt();
  static std::string RandomSalt();
  std::unique_ptr<cluster::MembershipView> view_;
  // Fans a call out to the nodes (base/task_pool.h): workers live as long as the client.
  std::unique_ptr<TaskPool> pool_ = std::make_unique<TaskPool>(8);

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  struct Registration {
    Registrar registrar;
    RemoteNamespace ns;
  };
  std::map<uint32_t, Registration> namespaces_ ABSL_GUARDED_BY(mu_);
  // Which nodes a recent Lookup found each chunk on: Fetch asks those first.
  std::unordered_map<storage::ChunkKey, std::vector<std::string>, storage::ChunkKeyHash> holders_
      ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  // When the membership last changed (by its version), for the repair grace period.
  uint64_t seen_version_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point membership_changed_ ABSL_GUARDED_BY(mu_) = Clock::now();
  std::deque<RepairJob> repairs_ ABSL_GUARDED_BY(mu_);
  std::set<storage::ChunkKey> repairing_ ABSL_GUARDED_BY(mu_);
  std::condition_variable_any repair_cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread repair_thread_;
};

}  // namespace kvc::client
