// Quotas: limits on what one owner (a tenant of the cache service) keeps in the store.
//
// Namespaces are put in quota groups (ChunkStore::SetQuotaGroup); a group's quota bounds
// the payload bytes its namespaces hold in RAM and on SSD, and how many of their chunks
// are pinned at once. A put that would take a group past a byte limit first evicts the
// group's own chunks from that tier (in the tier's usual order, eviction.h) — other
// groups' chunks are never touched for it; when everything it could give up is pinned the
// put fails with ResourceExhausted naming the owner and the limit. A pin past the pin
// limit fails the same way. Group 0 (every namespace not put in a group) has no quota.
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
};

// What a group holds now.
struct QuotaUsage {
  uint64_t ram_bytes = 0;
  uint64_t ssd_bytes = 0;
  uint64_t pinned_chunks = 0;
};

}  // namespace kvc::storage
