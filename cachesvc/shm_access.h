// ShmAccess: which tenant may map which RAM pool over the shared-memory path.
//
// A mapping shows every chunk of the pool it maps, so no pool is shared between tenants:
//   - authentication off: every caller is the one tenant "default", whose chunks are all
//     in pool 0, and that pool is mappable;
//   - authentication on: each tenant named in --shm-tenants gets a RAM pool of its own
//     (ids 1, 2, … in the order named) and maps that one; every other tenant's chunks are
//     in pool 0, which nobody maps, and those tenants get PERMISSION_DENIED on every
//     shared-memory call.
// The flag is "NAME[=BYTES][,NAME[=BYTES]…]"; BYTES takes a K, M, G or T suffix (powers of
// 1024). A tenant named without a size gets an equal share of --ram-bytes with pool 0 and
// the other unsized tenants. The private pools are carved out of --ram-bytes.
// Immutable after construction, so thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "storage/chunk_store.h"
#include "storage/ram_tier.h"

namespace kvc::cachesvc {

class ShmAccess {
 public:
  // The single-tenant rule (authentication off): "default" maps pool 0.
  ShmAccess() = default;
  // InvalidArgument naming the item for a malformed flag, a duplicated tenant, a size of
  // zero, or pools that add up to more than ram_bytes.
  static absl::StatusOr<ShmAccess> Plan(absl::string_view flag, bool auth_enabled,
                                        uint64_t ram_bytes);

  // The pool the tenant maps, or nullopt if it may not use shared memory.
  std::optional<storage::RamPoolId> PoolOf(const std::string& tenant) const;
  // The same, for a call that needs the pool's arena now (the socket handshake, FetchRefs):
  // PermissionDenied naming the tenant if it may not, FailedPrecondition if its pool has
  // no slots in `store`.
  absl::StatusOr<storage::RamPoolId> MappablePool(const std::string& tenant,
                                                  const storage::ChunkStore& store) const;
  // Bytes of pool 0 and of the private pools 1, 2, … (StoreOptions::ram_bytes and
  // ram_pool_bytes).
  uint64_t default_pool_bytes() const { return default_pool_bytes_; }
  const std::vector<uint64_t>& private_pool_bytes() const { return private_pool_bytes_; }
  // The tenants with a pool of their own.
  std::set<std::string> tenants() const;

 private:
  bool auth_enabled_ = false;
  uint64_t default_pool_bytes_ = 0;
  std::vector<uint64_t> private_pool_bytes_;
  std::map<std::string, storage::RamPoolId> pools_;
};

}  // namespace kvc::cachesvc
