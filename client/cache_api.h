// CacheApi: what a worker asks of the cache (its types are plain C++: a worker that links
// the client never sees protobuf), whether it is one kvcached (CacheClient,
// client.h) or a cluster of them found through etcd (ClusterClient, cluster_client.h).
// ConnectCache picks by the address: "etcd://H:P[,H:P…]" is a cluster, "H:P" one daemon.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "cluster/etcd.h"

namespace kvc::client {

// Where a chunk is, fastest first after kNone (numbered as kvcache.v1.Tier on the wire).
enum class Tier : uint8_t { kNone = 0, kHbm = 1, kRam = 2, kSsd = 3, kRados = 4 };
// "none", "hbm", "ram", "ssd", "rados".
const char* TierName(Tier tier);

// When a Store is acknowledged (numbered as kvcache.v1.Durability on the wire).
enum class Durability : uint8_t {
  kMemory = 0,   // once in host RAM; written to SSD behind
  kDurable = 1,  // after the SSD write and an fdatasync begun after it
};

struct ClientOptions {
  // "H:P": one kvcached. "etcd://H:P[,H:P…]": the cluster whose membership is in that etcd.
  std::string address = "127.0.0.1:50051";
  std::string bearer_token;  // empty: no authorization metadata
  int timeout_ms = 30000;
  std::string tls_ca_file;  // set: TLS, trusting this CA bundle
  // Set (co-located with the daemon): map its RAM arena through this Unix socket, and
  // Fetch copies chunks found in RAM straight from shared memory. If the socket refuses
  // or is absent, the client uses gRPC only. (One daemon only.)
  std::string shm_socket;
  // With shared memory: keep the leases of fetched chunks until shortly before they end
  // (at most `max_held_chunks` chunks in all), so fetching a prefix again within a lease (the
  // next turn of an agent session, a shared system prompt) is a copy with no RPC at all.
  // A leased slot is never reused by the server, so the bytes cannot change under it.
  bool shm_lease_cache = true;
  uint32_t lease_ms = 10000;
  uint32_t max_held_chunks = 1024;
  // A cluster: copies of each chunk (0: 2 when the cluster has ≥ 2 nodes, else 1).
  uint32_t replicas = 0;
  // A cluster: a node that failed a call is skipped for this long (it is also dropped
  // from the membership when its etcd lease expires).
  int node_backoff_ms = 2000;
  // A cluster: a chunk a Lookup finds on fewer than R nodes is copied (in the background)
  // to its missing owners once the membership has been unchanged this long and every
  // member answered — so a node that is only restarting is not replaced. <0: never.
  int repair_grace_ms = 30000;
  // A cluster: a Lookup asks each chunk's R owners and this many next-ranked nodes (where a
  // copy sits after a node joins, until repair moves it), not every member — except while
  // the cluster is unsettled (above), when it asks every member.
  uint32_t lookup_extra_nodes = 2;
  // A cluster: how to reach its etcd when it runs with TLS and/or authentication.
  cluster::EtcdSecurity etcd = {};
};

struct RemoteNamespace {
  uint32_t id = 0;
  uint64_t chunk_bytes = 0;
  uint32_t chunk_tokens = 0;
  storage::ChunkKey root;
  uint64_t vocab_size = 0;  // 0: unknown (an older daemon), the server checks tokens
  // Registered with CacheClient::RegisterKeyedNamespace: the caller chooses each chunk's
  // key (CallerKey), stores with StoreChunks (each chunk's `key`, no tokens) and looks up,
  // fetches, pins and deletes by those keys. Token-based Lookup and Store are refused.
  bool caller_keys = false;
};

struct LookupResult {
  uint32_t matched_chunks = 0;
  std::vector<storage::ChunkKey> keys;  // every whole chunk of the tokens
  std::vector<Tier> tiers;              // one per matched chunk
  // A cluster: the node that serves each matched chunk (its best-ranked holder).
  std::vector<std::string> nodes;
  // One node asked about every chunk: the indices of those its tenant deleted there (the
  // node remembers; docs/cluster.md, "Deletes"). A cluster client treats them as missing.
  std::vector<uint32_t> deleted;
};

struct StoreResult {
  uint32_t stored = 0;
  uint32_t already_present = 0;
  std::vector<storage::ChunkKey> keys;
  // Store: the tokens its whole chunks cover (a partial last chunk is not stored).
  size_t tokens = 0;
};

// One chunk of a StoreChunks stream.
struct ChunkToStore {
  std::optional<storage::ChunkKey> parent;  // none: the first chunk of a prefix
  std::span<const uint32_t> tokens;         // chunk_tokens ids (a caller-keyed namespace: none)
  std::span<const uint8_t> payload;         // chunk_bytes
  // A caller-keyed namespace: the chunk's key, CallerKey(ns, the caller's key). There the
  // parent is optional (the page before, if the caller's pages form a chain).
  std::optional<storage::ChunkKey> key;
  // A copy of a chunk found on fewer nodes than it should be (a cluster client's read
  // repair), not a new store: a node where it was deleted refuses it.
  bool repair_copy = false;
};

// The chunk key of a caller's own key (1..64 bytes, e.g. a serving engine's page hash) in a
// caller-keyed namespace (public rule: prefix_hash.h CallerChunkKey). InvalidArgument
// naming the size when the key is empty or longer than 64 bytes, or `ns` is not
// caller-keyed.
absl::StatusOr<storage::ChunkKey> CallerKey(const RemoteNamespace& ns, std::string_view caller_key);

class CacheApi {
 public:
  virtual ~CacheApi() = default;

  virtual absl::StatusOr<RemoteNamespace> RegisterNamespace(const std::string& model_config_json,
                                                            const std::string& model_id,
                                                            uint32_t chunk_tokens = 0) = 0;
  // A caller-keyed namespace: pages of `page_bytes` stored under keys the caller chooses (a
  // serving engine's page hashes, mapped by CallerKey); see RemoteNamespace::caller_keys.
  virtual absl::StatusOr<RemoteNamespace> RegisterKeyedNamespace(const std::string& model_id,
                                                                 uint64_t page_bytes,
                                                                 uint32_t page_tokens = 0) = 0;
  // How many leading `keys` are cached (keys a caller holds: nothing is hashed).
  virtual absl::StatusOr<LookupResult> LookupKeys(const RemoteNamespace& ns,
                                                  std::span<const storage::ChunkKey> keys) = 0;
  // Chunks that each name their parent (token namespaces) or their key (caller-keyed ones).
  virtual absl::StatusOr<StoreResult> StoreChunks(const RemoteNamespace& ns,
                                                  std::span<const ChunkToStore> chunks,
                                                  Durability durability = Durability::kDurable,
                                                  uint32_t ttl_seconds = 0) = 0;
  // Keys of every whole chunk of `tokens` (no RPC).
  std::vector<storage::ChunkKey> Keys(const RemoteNamespace& ns,
                                      std::span<const uint32_t> tokens) const;
  virtual absl::StatusOr<LookupResult> Lookup(const RemoteNamespace& ns,
                                              std::span<const uint32_t> tokens) = 0;
  // Fetches keys in order into `out` (keys.size() × chunk_bytes). Returns how many leading
  // chunks arrived; a chunk missing mid-way (evicted since Lookup, or dropped because it
  // failed its checksum) ends the prefix there, so a caller can use the chunks before it;
  // `short_reason` (optional) then gets the server's word on that chunk.
  virtual absl::StatusOr<size_t> Fetch(const RemoteNamespace& ns,
                                       std::span<const storage::ChunkKey> keys,
                                       std::span<uint8_t> out,
                                       std::string* short_reason = nullptr) = 0;
  // Stores the whole chunks of `tokens` with their payloads (chunk_bytes each, whole chunks
  // only), chained after `parent` (nullopt: the prefix starts here). A partial last chunk —
  // a prompt almost always ends mid-chunk — is left out: StoreResult::tokens says how many
  // tokens were covered, and the rest is stored once whole, after the last key.
  virtual absl::StatusOr<StoreResult> Store(const RemoteNamespace& ns,
                                            std::optional<storage::ChunkKey> parent,
                                            std::span<const uint32_t> tokens,
                                            std::span<const uint8_t> payloads,
                                            Durability durability = Durability::kDurable,
                                            uint32_t ttl_seconds = 0) = 0;
  virtual absl::StatusOr<uint32_t> Pin(const RemoteNamespace& ns,
                                       std::span<const storage::ChunkKey> keys,
                                       uint32_t ttl_seconds) = 0;
  virtual absl::StatusOr<uint32_t> Unpin(const RemoteNamespace& ns,
                                         std::span<const storage::ChunkKey> keys) = 0;
  virtual absl::StatusOr<uint32_t> Delete(const RemoteNamespace& ns,
                                          std::span<const storage::ChunkKey> keys) = 0;
};

// How many whole chunks `tokens` token ids make in `ns` (a partial tail left out);
// InvalidArgument naming the sizes when `payload_bytes` is not exactly theirs.
absl::StatusOr<size_t> WholeChunks(const RemoteNamespace& ns, size_t tokens, size_t payload_bytes);

// The whole chunks of `tokens` (with `payloads`) chained after `parent` (nullopt: the
// prefix starts here), as StoreChunks takes them, and their keys; WholeChunks' errors.
struct ChainedChunks {
  std::vector<ChunkToStore> chunks;
  std::vector<storage::ChunkKey> keys;
};
absl::StatusOr<ChainedChunks> ChainChunks(const RemoteNamespace& ns,
                                          std::optional<storage::ChunkKey> parent,
                                          std::span<const uint32_t> tokens,
                                          std::span<const uint8_t> payloads);

// OK when `chunk` (number `index` of a StoreChunks call) fits `ns`: a key and no tokens in a
// caller-keyed namespace, chunk_tokens ids and no key in a token one, chunk_bytes of
// payload; InvalidArgument naming what is wrong otherwise.
absl::Status CheckChunk(const RemoteNamespace& ns, const ChunkToStore& chunk, size_t index);

// One daemon or a cluster, by `options.address` (see ClientOptions::address).
absl::StatusOr<std::unique_ptr<CacheApi>> ConnectCache(const ClientOptions& options);

}  // namespace kvc::client
