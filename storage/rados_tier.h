// RadosTier: chunks as objects of a Ceph RADOS pool — the shared, durable tier below every
// node's RAM and SSD (docs/storage.md, "RADOS tier"), so a session's chunks outlive the
// nodes that wrote them. Not yet wired into ChunkStore / kvcached: this is the object
// format and its checks, used by tests/storage/rados_tier_test.cc against a real cluster.
//
// One object per chunk, named by its storage key (namespace-bound: tenants stay apart), in
// one atomic write: the payload as the object's data, and what a reader must check beside
// it as xattrs — namespace, payload bytes and checksum ("kvc.meta", fixed little-endian),
// and the origin, parent and expiry ("kvc.chain"). A read checks all of it: bytes whose
// checksum does not verify, or an object of another namespace or size, are never handed
// out (DataLoss), and an absent object is NotFound.
//
// Thread-safe (librados is); each call is synchronous, bounded by the options' timeouts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/chunk_key.h"

namespace kvc::storage {

using NamespaceId = uint32_t;

struct RadosTierOptions {
  std::string pool;            // must exist
  std::string conf_file;       // ceph.conf; empty: librados' default search
  std::string user = "admin";  // cephx client name (client.<user>)
  uint32_t op_timeout_s = 5;   // a call that waits longer fails (an OSD stopped, …)
  uint32_t connect_timeout_s = 10;
};

// What is stored beside a chunk's bytes.
struct RadosChunk {
  NamespaceId namespace_id = 0;
  uint64_t payload_checksum = 0;  // PayloadChecksum of the payload
  std::optional<ChunkKey> parent;
  std::optional<ChunkOrigin> origin;
  int64_t expires_s = 0;  // 0: no TTL
};

class RadosTier {
 public:
  static absl::StatusOr<std::unique_ptr<RadosTier>> Connect(const RadosTierOptions& options);
  ~RadosTier();
  RadosTier(const RadosTier&) = delete;
  RadosTier& operator=(const RadosTier&) = delete;

  // Stores the chunk (replacing an object of the same key) in one atomic write.
  absl::Status Put(const ChunkKey& key, const RadosChunk& meta, std::span<const uint8_t> payload);
  // Reads the chunk of namespace `ns` into out (its size: the namespace's chunk size),
  // verified; *meta (if given) gets what was stored beside it. On an error out holds no
  // bytes to use.
  absl::Status Get(NamespaceId ns, const ChunkKey& key, std::span<uint8_t> out,
                   RadosChunk* meta = nullptr);
  // Whether the pool holds the key's object (not verified: a Get does that).
  absl::StatusOr<bool> Contains(const ChunkKey& key);
  // Removes the object; OK if it was not there.
  absl::Status Remove(const ChunkKey& key);

  static std::string ObjectName(const ChunkKey& key);  // "chunk-<hex key>"

 private:
  struct Impl;
  explicit RadosTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::storage
