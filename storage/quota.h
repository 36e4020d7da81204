// Quotas: limits on what one owner (a tenant of the cache service) keeps in the store.
//
// Namespaces are put in quota groups (ChunkStore::SetQuotaGroup); a group's quota bounds
// the bytes its namespaces take in RAM and on SSD, and how many of their chunks are
// pinned at once. A chunk is charged what it really takes: in RAM its payload in whole
// 4 KiB pages (ram_tier.h), on SSD the whole slot (every SSD slot is sized for the largest
// chunk the store accepts) — so a namespace of small chunks cannot hold more of a tier
// than its quota says, and in RAM it holds as many as its bytes allow.
//
// A byte quota is a guaranteed share of its tier:
// - Admission: SetQuota refuses (ResourceExhausted) a quota with which the groups' limits
//   would add up to more than the tier holds for them (ChunkStore::QuotaCapacity).
// - Over its limit, a put first evicts the group's own chunks from that tier (in the
//   tier's usual order, eviction.h) — other groups' chunks are never touched for it; when
//   everything it could give up is pinned the put fails with ResourceExhausted naming the
//   owner and the limit. A pin past the pin limit fails the same way.
// - Tier pressure (a full tier or RAM pool, whoever writes) evicts only chunks of
//   namespaces without a limit in that tier, or of groups over it (a lowered quota); a
//   group within its limit keeps every chunk. When nothing else can go, the put fails.
// Group 0 (every namespace not put in a group) has no quota and no guarantee.
// The shared tier (rados_bytes) is no node's: its limit is checked, not guaranteed — a
// durable put that would take the group's account past it is refused before anything is
// written (ResourceExhausted naming the owner, the limit and what it holds).
#pragma once

#include <cstdint>
#include <string>

namespace kvc::storage {

using QuotaGroup = uint32_t;

struct Quota {
  std::string owner;           // who the group is, for errors ("tenant alice")
  uint64_t ram_bytes = 0;      // 0: no limit
  uint64_t ssd_bytes = 0;      // 0: no limit
  uint64_t pinned_chunks = 0;  // 0: no limit
  // Bytes of the group's durable chunks in the shared tier (its account's count there,
  // fleet-wide: SharedTier::AccountBytes). Over it a durable put is refused — nothing in
  // the shared tier is evicted for it (it is the copy that outlives the nodes).
  uint64_t rados_bytes = 0;  // 0: no limit
};

// What a group holds now.
struct QuotaUsage {
  uint64_t ram_bytes = 0;
  uint64_t ssd_bytes = 0;
  uint64_t pinned_chunks = 0;
};

}  // namespace kvc::storage
