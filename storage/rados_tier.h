// RadosTier: the shared tier (shared_tier.h) on a Ceph RADOS pool — chunks as objects, so
// a session's chunks outlive the nodes that wrote them (docs/rados.md).
//
// One object per chunk, named by its storage key (namespace-bound: tenants stay apart), in
// one atomic write: the payload as the object's data, and what a reader must check beside
// it as xattrs — the namespace's shared tag, payload bytes and checksum ("kvc.meta", fixed
// little-endian), the origin, parent and expiry ("kvc.chain") and the account
// ("kvc.account"). A read checks all of it: bytes whose
// checksum does not verify, or an object of another size, are never handed out
// (DataLoss); an absent object, or another namespace's, is NotFound.
//
// Accounts: an object's bytes are added to its account's usage object when a write
// creates it (an exclusive create tells a new object from one another node wrote first),
// and taken off when a remove deletes it; both by compare-and-swap on the usage object,
// so nodes that write at once count exactly.
//
// Thread-safe (librados is). A batch's operations are issued together (librados' aio) and
// waited for; each is bounded by op_timeout_s (rados_osd_op_timeout), so an OSD that is
// stopped or gone fails the call, never hangs it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
  absl::StatusOr<uint64_t> AccountBytes(const std::string& account) override;
  absl::StatusOr<SharedSweep> SweepExpired(int64_t now_s) override;

  // One chunk at a time, as the batches do it.
  absl::Status Put(const ChunkKey& key, const RadosChunk& meta, std::span<const uint8_t> payload);
  absl::Status Get(SharedTag ns, const ChunkKey& key, std::span<uint8_t> out,
                   RadosChunk* meta = nullptr);
  absl::StatusOr<bool> Contains(const ChunkKey& key);
  // Removes the object; OK if it was not there.
  absl::Status Remove(const ChunkKey& key);

  static std::string ObjectName(const ChunkKey& key);  // "chunk-<hex key>"
  // The object counting an account's bytes: "usage-<hex of its hash>" (the account's name
  // in its xattr kvc.account, its bytes as a decimal string in kvc.bytes).
  static std::string UsageObjectName(const std::string& account);

 private:
  struct Impl;
  absl::StatusOr<std::optional<uint64_t>> ReadUsage(const std::string& account);
  // Adds delta (negative: takes it off, never below 0) to the account's count.
  absl::Status Charge(const std::string& account, int64_t delta);
  // Removes the named objects, their bytes leaving their accounts.
  std::vector<absl::Status> RemoveObjects(std::span<const std::string> names);
  explicit RadosTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvc::storage
