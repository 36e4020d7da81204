// TenantQuotas: what each tenant may keep in the store (--tenant-quota), as storage quotas
// (storage/quota.h) — RAM bytes, SSD bytes and pinned chunks.
//
// Each flag is "TENANT:KIND=N[,KIND=N…]" with KIND ram, ssd, rados (bytes, with a K, M, G
// or T suffix for powers of 1024) or pins (chunks); rados bounds the tenant's bytes in the
// shared tier, fleet-wide (storage/quota.h); the tenant "*" stands for every tenant not
// named in a flag of its own. A tenant over a byte quota gives up its own chunks first;
// when all it holds is pinned its Store fails with RESOURCE_EXHAUSTED naming it and the
// limit. Other tenants are never evicted for it.
// Immutable after Parse, so thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/chunk_store.h"
#include "storage/quota.h"

namespace kvc::cachesvc {

// Who a tenant is to storage: "tenant NAME" — its quota's owner (the name errors give) and
// the account its chunks count against in a shared tier (SharedChunk::account), the same
// on every node.
std::string SharedAccountOf(const std::string& tenant);

// BYTES with an optional K, M, G or T suffix (powers of 1024), positive. InvalidArgument
// naming the flag and the item otherwise.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view flag, absl::string_view item,
                                       absl::string_view text);

class TenantQuotas {
 public:
  // InvalidArgument naming the flag item for a malformed one, an unknown kind, a tenant
  // named twice, or a quota without any limit.
  static absl::StatusOr<TenantQuotas> Parse(const std::vector<std::string>& flags);

  // The tenant's quota (its owner reads "tenant NAME"), or nullopt: no limits. With a
  // default pin limit, every tenant has one: a quota that names no pin limit takes the
  // default, and a tenant no quota names gets a quota of that pin limit alone.
  std::optional<storage::Quota> For(const std::string& tenant) const;
  // kvcached --default-pin-limit (with tenants): pinned chunks of a tenant no quota limits
  // (0: none).
  void set_default_pins(uint64_t chunks) { default_pins_ = chunks; }
  bool empty() const { return named_.empty() && !others_; }
  // Whether the named tenants' byte quotas fit the tiers together (storage's SetQuota
  // rule: a quota is a guaranteed share). ResourceExhausted naming the tier, the sum and
  // the room otherwise. Tenants under "*" are admitted one by one as they register.
  absl::Status CheckNamedFit(const storage::ChunkStore::QuotaRoom& room) const;

 private:
  std::map<std::string, storage::Quota> named_;
  std::optional<storage::Quota> others_;  // "*"
  uint64_t default_pins_ = 0;
};

}  // namespace kvc::cachesvc
