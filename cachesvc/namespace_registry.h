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
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"

namespace kvc::cachesvc {

struct NamespaceInfo {
  uint32_t id = 0;
  std::string tenant;
  std::string model_id;
  uint32_t chunk_tokens = 0;
  uint64_t chunk_bytes = 0;
  uint64_t vocab_size = 0;
  storage::ChunkKey root;
  // How the namespace's chunk keys reach storage (StorageKey): kKeyScopeBound for every
  // namespace registered since keys are bound, 0 for one an older kvcached registered
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

// The key storage holds a chunk of `ns` under: with kKeyScopeBound,
// XXH3-128("kvcache-scope-v1" ‖ root key ‖ chunk key) (prefix_hash.h: BoundChunkKey); the
// chunk key itself in a namespace of key_scope 0. Callers always see their own keys.
storage::ChunkKey StorageKey(const NamespaceInfo& ns, const storage::ChunkKey& key);
std::vector<storage::ChunkKey> StorageKeys(const NamespaceInfo& ns,
                                           std::span<const storage::ChunkKey> keys);

// How a new namespace gets its id.
enum class NamespaceIds {
  kSequential,  // 1, 2, 3, … in registration order (a single daemon)
  // From (tenant, root key), so every node of a cluster gives the same namespace the same
  // id without talking to the others (DerivedNamespaceId; docs/cluster.md).
  kDerived,
};

// 1 + XXH3-64(tenant ‖ 0x00 ‖ root key bytes) mod (2^31 − 1).
uint32_t DerivedNamespaceId(const std::string& tenant, const storage::ChunkKey& root);

class NamespaceRegistry {
 public:
  // `max_per_tenant`: namespaces one tenant may register (0: no limit).
  static absl::StatusOr<std::unique_ptr<NamespaceRegistry>> Open(
      const std::string& data_dir, size_t max_per_tenant = 0,
      NamespaceIds ids = NamespaceIds::kSequential);
  ~NamespaceRegistry();

  // The existing namespace with info's tenant and root, or a new one with a fresh id.
  // ResourceExhausted naming the tenant and the limit when it has registered its quota.
  absl::StatusOr<NamespaceInfo> FindOrAdd(NamespaceInfo info);
  // The namespace if it exists and belongs to `tenant` (another tenant's: nullopt, so its
  // existence does not leak).
  std::optional<NamespaceInfo> Get(uint32_t id, const std::string& tenant) const;
  // Every namespace, in id order.
  std::vector<NamespaceInfo> All() const;

 private:
  NamespaceRegistry(std::string dir, size_t max_per_tenant, NamespaceIds ids)
      : dir_(std::move(dir)), max_per_tenant_(max_per_tenant), ids_(ids) {}
  absl::Status Load();
  absl::Status Append(const NamespaceInfo& n);  // under mu_

  std::string dir_;
  size_t max_per_tenant_;
  NamespaceIds ids_;
  int fd_ = -1;  // the log, open for appending
  mutable std::mutex mu_;
  std::map<uint32_t, NamespaceInfo> by_id_;
  std::map<std::pair<std::string, storage::ChunkKey>, uint32_t> by_root_;
  std::map<std::string, size_t> per_tenant_;
};

}  // namespace kvc::cachesvc
