// CacheClient: the C++ client of kvcached, for inference workers and tools.
//
// Hashing is local (the public algorithm of prefix_hash.h, from the root key the server
// returns), so a worker knows every chunk key before asking. Fetch writes payloads
// straight into the caller's buffer; Store sends a whole prefix in one stream. Every call
// has a deadline (Options::timeout_ms) and returns the server's status (code and message)
// as absl::Status. Thread-safe: one client may serve many threads.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "base/mutex.h"
#include "client/arena_map.h"
#include "client/cache_api.h"

// The generated protobuf and gRPC types stay out of this header (a worker that links the
// client includes no protobuf); Stats' answer is defined in client/stats.h.
namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc
namespace kvcache::v1 {
class LookupRequest;
class RegisterNamespaceRequest;
class LookupResponse;
class StatsResponse;
}  // namespace kvcache::v1

namespace kvc::client {

// Chunks leased in the daemon's HBM tier: map the arena with ipc_handle on `device` (once
// per arena_id; kernels/hbm_arena.h) and copy or read them until the lease ends.
struct DeviceRefs {
  uint64_t lease_id = 0;  // 0: nothing leased
  std::string ipc_handle;
  int device = 0;
  uint64_t arena_id = 0;
  std::chrono::steady_clock::time_point usable_until;  // a margin before the server's end
  struct Chunk {
    storage::ChunkKey key;
    uint64_t offset = 0, length = 0;
    uint64_t checksum = 0;  // XXH3-64 of its bytes (0: a kvcached that does not send it)
    // Whether `bytes`, copied out of the arena, are the chunk's: the arena is mapped
    // writable by every process that maps it, so what a reader copied is checked before
    // use, as a fetched chunk is by the server before it is sent.
    bool Verifies(std::span<const uint8_t> bytes) const;
  };
  std::vector<Chunk> chunks;  // the leading chunks of the request, in order
};

class CacheClient final : public CacheApi {
 public:
  static absl::StatusOr<std::unique_ptr<CacheClient>> Connect(const ClientOptions& options);

  absl::StatusOr<RemoteNamespace> RegisterNamespace(const std::string& model_config_json,
                                                    const std::string& model_id,
                                                    uint32_t chunk_tokens = 0) override;
  // A namespace whose keys the caller chooses (a serving engine's page hashes; see
  // RemoteNamespace::caller_keys): pages of `page_bytes` laid out by the caller, each
  // covering `page_tokens` tokens (0: not said). Same tenant, model_id, page_bytes and
  // page_tokens: the same namespace.
  absl::StatusOr<RemoteNamespace> RegisterKeyedNamespace(const std::string& model_id,
                                                         uint64_t page_bytes,
                                                         uint32_t page_tokens = 0) override;
  absl::StatusOr<LookupResult> Lookup(const RemoteNamespace& ns,
                                      std::span<const uint32_t> tokens) override;
  // Lookup by keys the caller holds (a caller-keyed namespace's, or a token namespace's
  // from an earlier turn): how many leading ones are cached; nothing is hashed.
  absl::StatusOr<LookupResult> LookupKeys(const RemoteNamespace& ns,
                                          std::span<const storage::ChunkKey> keys) override;
  // Every whole chunk's tier on this daemon (TIER_NONE where it has none), not only the
  // leading run's: what a cluster client merges across nodes.
  absl::StatusOr<LookupResult> LookupEvery(const RemoteNamespace& ns,
                                           std::span<const uint32_t> tokens);
  // LookupEvery for keys already computed (a cluster client hashes once for every node);
  // the result's `keys` are these.
  absl::StatusOr<LookupResult> LookupKeysEvery(const RemoteNamespace& ns,
                                               std::span<const storage::ChunkKey> keys);
  absl::StatusOr<size_t> Fetch(const RemoteNamespace& ns, std::span<const storage::ChunkKey> keys,
                               std::span<uint8_t> out,
                               std::string* short_reason = nullptr) override;
  absl::StatusOr<StoreResult> Store(const RemoteNamespace& ns,
                                    std::optional<storage::ChunkKey> parent,
                                    std::span<const uint32_t> tokens,
                                    std::span<const uint8_t> payloads,
                                    Durability durability = Durability::kDurable,
                                    uint32_t ttl_seconds = 0) override;
  // Like Fetch, with chunk i written to dst[i] (chunk_bytes each): a cluster client puts
  // each node's share of a prefix straight where it belongs.
  absl::StatusOr<size_t> FetchScattered(const RemoteNamespace& ns,
                                        std::span<const storage::ChunkKey> keys,
                                        std::span<uint8_t* const> dst,
                                        std::string* short_reason = nullptr);
  // Stores chunks that need not follow one another (each names its own parent), in one
  // stream: what a cluster client sends each node (its share of a prefix).
  absl::StatusOr<StoreResult> StoreChunks(const RemoteNamespace& ns,
                                          std::span<const ChunkToStore> chunks,
                                          Durability durability = Durability::kDurable,
                                          uint32_t ttl_seconds = 0) override;
  absl::StatusOr<uint32_t> Pin(const RemoteNamespace& ns, std::span<const storage::ChunkKey> keys,
                               uint32_t ttl_seconds) override;
  absl::StatusOr<uint32_t> Unpin(const RemoteNamespace& ns,
                                 std::span<const storage::ChunkKey> keys) override;
  absl::StatusOr<uint32_t> Delete(const RemoteNamespace& ns,
                                  std::span<const storage::ChunkKey> keys) override;
  // The daemon's counters, for operators' tools (include client/stats.h to use the answer).
  absl::StatusOr<kvcache::v1::StatsResponse> Stats();
  // Co-located engines on the daemon's GPU: leases the leading chunks of `keys` in its HBM
  // tier (the daemon first copies there those in RAM or on SSD). FailedPrecondition when
  // it has no HBM tier. End the lease with ReleaseDeviceRefs once the copies are done.
  absl::StatusOr<DeviceRefs> FetchDeviceRefs(const RemoteNamespace& ns,
                                             std::span<const storage::ChunkKey> keys);
  absl::Status ReleaseDeviceRefs(uint64_t lease_id);
  // Whether the shared-memory path is in use, and why not if it is not.
  bool shared_memory() const { return arena_.base != nullptr; }
  const std::string& shared_memory_error() const { return shm_error_; }
  ~CacheClient();

 private:
  CacheClient(ClientOptions o, std::shared_ptr<grpc::Channel> ch);
  std::unique_ptr<grpc::ClientContext> Context() const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  struct Rpc;  // the generated gRPC stub (client.cc)
  std::unique_ptr<Rpc> rpc_;
  MappedArena arena_;
  std::string shm_error_;
  // Shared-memory leases this client holds, and where each leased chunk is.
  struct HeldRef {
    uint64_t lease_id;
    uint64_t arena_offset;
    uint64_t checksum;  // the chunk's, from FetchRefs (0: an older daemon, not checked)
  };
  struct HeldLease {
    std::chrono::steady_clock::time_point usable_until;  // a margin before the server's end
    // The arena's verdict count read before the FetchRefs that took this lease, and where
    // it lies (0: a daemon without one; each copy is then checked against its checksum).
    uint64_t verdicts = 0;
    uint64_t verdict_offset = 0;
    uint32_t refs = 0;  // entries of held_refs_ naming it
  };
  // Takes every key from held leases (all or nothing) and copies it out; false if one is
  // missing or its lease is about to end, or if the daemon has dropped a copy in the arena
  // as corrupt since the lease was taken (its verdict count moved; the held leases are
  // then given up and the next call asks the daemon, whose scrub has the last word). With
  // a daemon that keeps no count, each copy is checked against its checksum instead.
  bool CopyFromHeldLeases(const RemoteNamespace& ns, std::span<const storage::ChunkKey> keys,
                          std::span<uint8_t* const> dst);
  // Leases whose time is up or that no held chunk names any more, to release on the next
  // FetchRefs (the server would end them on time anyway).
  std::vector<uint64_t> TakeLeasesToRelease();
  void HoldLease(uint64_t lease_id, std::chrono::steady_clock::time_point usable_until,
                 std::span<const storage::ChunkKey> keys, const std::vector<uint64_t>& offsets,
                 const std::vector<uint64_t>& checksums, uint64_t verdicts,
                 uint64_t verdict_offset);
  // The arena's verdict count at `offset` (0 when offset is 0 or outside the mapping).
  uint64_t ReadVerdicts(uint64_t offset) const;

  // Asks with the keys packed end to end; again with one string per key if the daemon
  // predates packed keys (req: namespace and every_chunk set).
  absl::Status LookupByKeys(kvcache::v1::LookupRequest& req,
                            std::span<const storage::ChunkKey> keys,
                            kvcache::v1::LookupResponse* resp);
  absl::StatusOr<LookupResult> LookupKeysImpl(const RemoteNamespace& ns,
                                              std::span<const storage::ChunkKey> keys,
                                              bool every_chunk);
  absl::StatusOr<RemoteNamespace> Register(const kvcache::v1::RegisterNamespaceRequest& req);
  absl::StatusOr<LookupResult> LookupImpl(const RemoteNamespace& ns,
                                          std::span<const uint32_t> tokens, bool every_chunk);
  absl::StatusOr<size_t> FetchImpl(const RemoteNamespace& ns,
                                   std::span<const storage::ChunkKey> keys,
                                   std::span<uint8_t* const> dst, std::string* short_reason,
                                   bool may_remap);
  // The daemon behind the socket has another arena now: forget held leases and map the
  // new arena (`map_again`), or stop using shared memory.
  void RemapArena(uint64_t stale_lease, bool map_again);

  Mutex lease_mu_;
  std::vector<MappedArena> old_arenas_ ABSL_GUARDED_BY(lease_mu_);  // unmapped when it ends
  std::unordered_map<storage::ChunkKey, HeldRef, storage::ChunkKeyHash> held_refs_
      ABSL_GUARDED_BY(lease_mu_);
  std::map<uint64_t, HeldLease> held_leases_ ABSL_GUARDED_BY(lease_mu_);  // oldest first
  std::vector<uint64_t> to_release_ ABSL_GUARDED_BY(lease_mu_);
};

}  // namespace kvc::client
