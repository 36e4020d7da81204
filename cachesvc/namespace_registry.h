// NamespaceRegistry: the durable list of namespaces, each owned by one tenant.
// Registering the same (tenant, model, layout, chunk size) again returns the same id.
//
// Kept as an append-only log in the data folder (namespaces.jsonl, one JSON object per
// line): a registration appends one line and syncs it, so its cost does not grow with the
// number of namespaces. A line torn by a crash is the last one and is dropped at the next
// open; damage anywhere else is DataLoss. A folder from an older kvcached (namespaces.json,
// one JSON array) is converted on open. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "base/mutex.h"

namespace kvc::cachesvc {

struct NamespaceInfo {
  // The id its tenant calls it by: unique among that tenant's namespaces only, so no other
  // tenant's registration can take it, reveal it or change what it names.
  uint32_t id = 0;
  // The id storage keeps its chunks under (ChunkStore's NamespaceId): unique on this node,
  // never sent to a client or a peer. Equal to `id` for every namespace registered before
  // ids were scoped per tenant (their chunks are stored under it).
  uint32_t store_id = 0;
  std::string tenant;
  std::string model_id;
  uint32_t chunk_tokens = 0;
  uint64_t chunk_bytes = 0;
  uint64_t vocab_size = 0;
  storage::ChunkKey root;
  // How the namespace's chunk keys reach storage (StorageKey): kKeyScopeLatest for every
  // namespace registered now, kKeyScopeBound or 0 for one an older kvcached registered
  // (its chunks stay stored under the keys as given, so a restart loses none of them).
  uint32_t key_scope = 0;
  // Where the chunk keys come from: kKeysFromTokens (derived; chunk_tokens and vocab_size
  // are the model's) or kKeysFromCaller (the caller's own keys mapped by CallerChunkKey;
  // chunk_bytes is the caller's page size, vocab_size 0: no tokens are ever given).
  uint32_t key_mode = 0;
};

inline constexpr uint32_t kKeysFromTokens = 0;  // = kvcache.v1.KEY_MODE_TOKENS
inline constexpr uint32_t kKeysFromCaller = 1;  // = kvcache.v1.KEY_MODE_CALLER

// Chunk keys bound to their namespace: the same key in two namespaces is two chunks, so
// one tenant's stores can neither fail because of, nor reveal, another tenant's chunks.
inline constexpr uint32_t kKeyScopeBound = 1;
// Bound with a domain-separated input that no token-chain step can produce (prefix_hash.h:
// BoundChunkKeyV2): every namespace registered since. A namespace of scope 1 keeps it, so
// its stored chunks stay found.
inline constexpr uint32_t kKeyScopeSeparated = 2;
inline constexpr uint32_t kKeyScopeLatest = kKeyScopeSeparated;

// The key storage holds a chunk of `ns` under: with kKeyScopeSeparated,
// XXH3-128("kvcache-scope-v2:" ‖ root key ‖ chunk key) (BoundChunkKeyV2); with
// kKeyScopeBound, XXH3-128("kvcache-scope-v1" ‖ root key ‖ chunk key) (BoundChunkKey); the
// chunk key itself in a namespace of key_scope 0. Callers always see their own keys.
storage::ChunkKey StorageKey(const NamespaceInfo& ns, const storage::ChunkKey& key);
std::vector<storage::ChunkKey> StorageKeys(const NamespaceInfo& ns,
                                           std::span<const storage::ChunkKey> keys);

// The namespace's name in a shared tier (storage/shared_tier.h): XXH3-64 of
// "kvcache-shared-v1:" ‖ root key (never 0), the same on every node, tenant-bound as the root
// is.
uint64_t SharedNamespaceTag(const NamespaceInfo& ns);

// How a new namespace gets its id.
enum class NamespaceIds {
  kSequential,  // 1, 2, 3, … in registration order (a single daemon)
  // From (tenant, root key), so every node of a cluster gives the same namespace the same
  // id without talking to the others (DerivedNamespaceId; docs/cluster.md).
  kDerived,
};

// 1 + XXH3-64(tenant ‖ 0x00 ‖ root key bytes) mod (2^31 − 1).
uint32_t DerivedNamespaceId(const std::string& tenant, const storage::ChunkKey& root);

// What the registry holds for one tenant at most, and what a loaded entry may be. Every
// field a tenant supplies is bounded, so a tenant cannot grow the log, the daemon's memory
// or a peer call's size beyond these (docs/security.md, "Bounded metadata").
struct RegistryLimits {
  size_t max_per_tenant = 0;              // namespaces one tenant may register (0: no limit)
  size_t max_bytes_per_tenant = 0;        // bytes of its log lines, all together (0: no limit)
  size_t max_name_bytes = 256;            // tenant and model_id, each
  uint64_t max_chunk_bytes = 1ull << 30;  // a loaded entry's chunk_bytes, at most
};

class NamespaceRegistry {
 public:
  // Opens (or creates) the registry of `data_dir`. A log entry that breaks a rule — an id
  // of 0 or one used twice, a tenant and root registered twice, an empty or too long tenant
  // or model_id, a chunk size of 0 or above limits.max_chunk_bytes — fails the open with
  // FailedPrecondition naming the line and the rule: taken silently, it could hand one
  // tenant's pages to another or abort the daemon at its first Fetch.
  static absl::StatusOr<std::unique_ptr<NamespaceRegistry>> Open(
      const std::string& data_dir, RegistryLimits limits,
      NamespaceIds ids = NamespaceIds::kSequential);
  // `max_per_tenant`: namespaces one tenant may register (0: no limit); other limits default.
  static absl::StatusOr<std::unique_ptr<NamespaceRegistry>> Open(
      const std::string& data_dir, size_t max_per_tenant = 0,
      NamespaceIds ids = NamespaceIds::kSequential) {
    RegistryLimits limits;
    limits.max_per_tenant = max_per_tenant;
    return Open(data_dir, limits, ids);
  }
  ~NamespaceRegistry();

  // The existing namespace with info's tenant and root, or a new one with a fresh id (and a
  // fresh store_id). In a cluster (kDerived) two of one tenant's namespaces that derive the
  // same id are AlreadyExists, told to that tenant only.
  // ResourceExhausted naming the tenant and the limit when it has registered its quota of
  // namespaces or of bytes; InvalidArgument naming the field when a name is too long.
  absl::StatusOr<NamespaceInfo> FindOrAdd(NamespaceInfo info);
  // `tenant`'s namespace of that id, if it has one (another tenant's id names nothing here,
  // so its existence does not leak).
  std::optional<NamespaceInfo> Get(uint32_t id, const std::string& tenant) const;
  // Every namespace, in store_id order.
  std::vector<NamespaceInfo> All() const;

 private:
  NamespaceRegistry(std::string dir, RegistryLimits limits, NamespaceIds ids)
      : dir_(std::move(dir)), limits_(limits), ids_(ids) {}
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);
  // InvalidArgument naming the field when the tenant or model_id is empty or too long.
  absl::Status CheckNames(const NamespaceInfo& n) const;
  absl::Status Append(const std::string& line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string dir_;
  RegistryLimits limits_;
  NamespaceIds ids_;
  mutable Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;                                 // the log, open for appending
  std::map<uint32_t, NamespaceInfo> by_store_ ABSL_GUARDED_BY(mu_);  // store_id → namespace
  // (tenant, id) → store_id
  std::map<std::pair<std::string, uint32_t>, uint32_t> by_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, storage::ChunkKey>, uint32_t> by_root_
      ABSL_GUARDED_BY(mu_);  // → store_id
  std::map<std::string, size_t> per_tenant_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> bytes_per_tenant_ ABSL_GUARDED_BY(mu_);  // of its log lines
};

}  // namespace kvc::cachesvc
