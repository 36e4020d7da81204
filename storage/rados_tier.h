// RadosTier: the shared tier (shared_tier.h) on a Ceph RADOS pool — chunks as objects, so
// a session's chunks outlive the nodes that wrote them (docs/rados.md).
//
// One object per chunk, named by its storage key (namespace-bound: tenants stay apart), in
// one atomic write: the payload as the object's data, and what a reader must check beside
// it as xattrs — the namespace's shared tag, payload bytes and checksum ("kvc.meta", fixed
// little-endian),
// and the origin, parent and expiry ("kvc.chain"). A read checks all of it: bytes whose
// checksum does not verify, or an object of another size, are never handed out
// (DataLoss); an absent object, or another namespace's, is NotFound.
//
// Thread-safe (librados is). A batch's operations are issued together (librados' aio) and
// waited for; each is bounded by op_timeout_s (rados_osd_op_timeout), so an OSD that is
// stopped or gone fails the call, never hangs it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "storage/shared_tier.h"

namespace kvc::storage {

struct RadosTierOptions {
  std::string pool;            // must exist
  std::string conf_file;       // ceph.conf; empty: librados' default search
  std::string user = "admin";  // cephx client name (client.<user>)
  uint32_t op_timeout_s = 5;   // a call that waits longer fails (an OSD stopped, …)
  uint32_t connect_timeout_s = 10;
};

using RadosChunk = SharedChunk;

class RadosTier final : public SharedTier {
 public:
  static absl::StatusOr<std::unique_ptr<RadosTier>> Connect(const RadosTierOptions& options);
  ~RadosTier() override;
  RadosTier(const RadosTier&) = delete;
  RadosTier& operator=(const RadosTier&) = delete;

  const char* name() const override { return "rados"; }
  // (The payload's checksum is computed from the bytes as they are copied for the write;
  // meta.payload_checksum is not read.)
  std::vector<absl::Status> PutMany(std::span<const SharedPut> puts) override;
  std::vector<absl::Status> GetMany(SharedTag ns, std::span<const ChunkKey> keys,
                                    std::span<const std::span<uint8_t>> outs,
                                    std::vector<SharedChunk>* metas) override;
  std::vector<absl::StatusOr<bool>> ContainsMany(std::span<const ChunkKey> keys) override;
  std::vector<absl::Status> RemoveMany(std::span<const ChunkKey> keys) override;

  // One chunk at a time, as the batches do it.
  absl::Status Put(const ChunkKey& key, const RadosChunk& meta, std::span<const uint8_t> payload);
  absl::Status Get(SharedTag ns, const ChunkKey& key, std::span<uint8_t> out,
                   RadosChunk* meta = nullptr);
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
