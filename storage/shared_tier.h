// SharedTier: the durable tier below every node's RAM and SSD, shared by the nodes of a
// fleet, so that a session's chunks outlive the nodes that wrote them (docs/rados.md).
// ChunkStore talks to it through this interface only; RadosTier (rados_tier.h, built where
// librados is installed) is the implementation, on a Ceph RADOS pool.
//
// Chunks are named by their storage key (namespace-bound: tenants stay apart) and stored
// with what a reader must check beside them. A read verifies the namespace, the size and
// the checksum: bytes that do not verify are never handed out (DataLoss), another
// namespace's chunk is NotFound. Each call works on a batch, its operations in flight
// together (one round trip, not one per chunk), each bounded by the tier's timeout.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "storage/payload.h"

namespace kvc::storage {

using NamespaceId = uint32_t;

// What is stored beside a chunk's bytes.
// A namespace is named in the shared tier by a tag every node gives it alike
// (ChunkStore::SetSharedTag; a store id is one node's own).
using SharedTag = uint64_t;

struct SharedChunk {
  SharedTag namespace_tag = 0;
  uint64_t payload_checksum = 0;  // PayloadChecksum of the payload
  std::optional<ChunkKey> parent;
  std::optional<ChunkOrigin> origin;
  int64_t expires_s = 0;  // 0: no TTL (wall-clock seconds)
  // Whose bytes these are (the namespace's owner, "tenant alice"; ChunkStore::SetSharedTag):
  // the tier counts each account's bytes as its objects are created and removed
  // (AccountBytes), for quotas that span the fleet. Empty: counted nowhere.
  std::string account;
};

// What a sweep of expired chunks did (SharedTier::SweepExpired).
struct SharedSweep {
  uint64_t listed = 0;   // chunk objects looked at
  uint64_t removed = 0;  // past their expiry, removed
  uint64_t errors = 0;   // objects that could not be read or removed (left for the next)
};

struct SharedPut {
  ChunkKey key;
  SharedChunk meta;
  Payload payload;  // viewed: must outlive the call
};

// What a store's link to its shared tier has done since open (StoreStats::shared).
struct SharedTierStats {
  std::string name;           // empty: no shared tier
  bool write_behind = false;  // durable puts acknowledged before the shared copy
  uint64_t puts = 0;          // chunks written to it
  uint64_t put_errors = 0;    // writes it refused or did not answer in time
  uint64_t hits = 0;          // local misses it served (verified), then promoted
  uint64_t misses = 0;        // local misses it did not hold either
  uint64_t read_errors = 0;   // reads that failed (not a miss), bad bytes included
  uint64_t removes = 0;
  uint64_t sweeps = 0;          // sweeps of expired chunks done (SweepExpired)
  uint64_t swept = 0;           // chunks they removed
  uint64_t backlog_chunks = 0;  // write-behind: waiting to be written
  uint64_t backlog_bytes = 0;
  bool reachable = true;   // its last operation was answered
  std::string last_error;  // of the last failed operation
};

class SharedTier {
 public:
  virtual ~SharedTier() = default;
  virtual const char* name() const = 0;  // "rados"
  // Stores each chunk, replacing an object of the same key, in one atomic write each.
  virtual std::vector<absl::Status> PutMany(std::span<const SharedPut> puts) = 0;
  // Reads each chunk of the namespace tagged `ns` into its out (exactly its size),
  // verified; metas (if given, resized) get what was stored beside each. NotFound where
  // absent (or another namespace's).
  virtual std::vector<absl::Status> GetMany(SharedTag ns, std::span<const ChunkKey> keys,
                                            std::span<const std::span<uint8_t>> outs,
                                            std::vector<SharedChunk>* metas) = 0;
  // Whether each key's object is there (not verified: a read does that).
  virtual std::vector<absl::StatusOr<bool>> ContainsMany(std::span<const ChunkKey> keys) = 0;
  // Removes each object; NotFound where it was not there. The bytes removed leave their
  // account.
  virtual std::vector<absl::Status> RemoveMany(std::span<const ChunkKey> keys) = 0;
  // The bytes of the chunks stored under `account` now, fleet-wide: an object is counted
  // once however many nodes write it (only its creation counts), and leaves the count when
  // it is removed. A writer that dies between an object and its count leaves the count
  // off by that object (docs/rados.md, "Quotas").
  virtual absl::StatusOr<uint64_t> AccountBytes(const std::string& account) = 0;
  // Lists every chunk and removes those whose expiry (wall-clock seconds) is before now_s:
  // a chunk past its TTL that nobody reads again still leaves the tier. Unavailable when
  // the listing fails.
  virtual absl::StatusOr<SharedSweep> SweepExpired(int64_t now_s) = 0;
};

}  // namespace kvc::storage
