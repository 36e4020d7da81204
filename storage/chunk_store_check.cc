// ChunkStore::CheckConsistency: the bookkeeping of the SSD tier and the reservation
// checked against itself. A slot counted twice would let two chunks share it (one of
// them lost); a slot counted nowhere is capacity lost until the next open.
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

absl::Status ChunkStore::CheckConsistency() const {
  const Impl& s = *impl_;
  MutexLock lk(s.mu);
  if (s.in_flight != 0 || s.record_busy || !s.ssd_free_on_release.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the store is not quiet: ", s.in_flight, " SSD writes in flight, ",
        s.ssd_free_on_release.size(), " slots waiting for readers, reservation commit ",
        s.record_busy ? "running" : "idle"));
  }
  const uint64_t capacity = s.ssd ? s.ssd->capacity_slots() : 0;
  // Where each slot is: 0 nowhere, else the first place that claimed it.
  enum Place : uint8_t { kNowhere, kChunk, kFree, kReservedFree, kNamedNext };
  constexpr const char* kPlaceName[] = {"nowhere", "a chunk's", "free", "free in the reservation",
                                        "the next reservation's first"};
  std::vector<uint8_t> place(capacity, kNowhere);
  auto claim = [&](uint64_t slot, Place p, const std::string& what) -> absl::Status {
    if (slot >= capacity) {
      return absl::InternalError(
          absl::StrCat(what, " names SSD slot ", slot, " of a tier of ", capacity));
    }
    if (place[slot] != kNowhere) {
      return absl::InternalError(absl::StrCat("SSD slot ", slot, " is both ",
                                              kPlaceName[place[slot]], " and ", kPlaceName[p], " (",
                                              what, ")"));
    }
    place[slot] = p;
    return absl::OkStatus();
  };
  for (const auto& [key, record] : s.ssd_map) {
    KVC_RETURN_IF_ERROR(claim(s.GlobalSlot(record), kChunk, "chunk " + key.Hex()));
    if (!s.ssd_order.Contains(key)) {
      return absl::InternalError(
          absl::StrCat("chunk ", key.Hex(), " is on SSD but not in the eviction order"));
    }
  }
  if (s.ssd_order.size() != s.ssd_map.size()) {
    return absl::InternalError(absl::StrCat("the SSD eviction order has ", s.ssd_order.size(),
                                            " chunks, the tier ", s.ssd_map.size()));
  }
  for (uint64_t slot : s.ssd_free) {
    KVC_RETURN_IF_ERROR(claim(slot, kFree, "the free list"));
    if (s.reserved.contains(slot)) {
      return absl::InternalError(
          absl::StrCat("SSD slot ", slot, " is on the free list but listed in the reservation"));
    }
  }
  for (uint64_t slot : s.reserved_free) {
    KVC_RETURN_IF_ERROR(claim(slot, kReservedFree, "the reservation's free list"));
    if (!s.reserved.contains(slot)) {
      return absl::InternalError(
          absl::StrCat("SSD slot ", slot, " is free in the reservation but not listed in it"));
    }
  }
  if (s.next_first_slot) {
    KVC_RETURN_IF_ERROR(claim(*s.next_first_slot, kNamedNext, "the reservation's next slot"));
    if (s.reserved.contains(*s.next_first_slot)) {
      return absl::InternalError(absl::StrCat("SSD slot ", *s.next_first_slot,
                                              " is named the next reservation's first but is "
                                              "listed in the current one"));
    }
  }
  uint64_t nowhere = 0;
  for (uint8_t p : place) nowhere += p == kNowhere;
  if (nowhere != s.ssd_held_back) {
    return absl::InternalError(absl::StrCat(
        nowhere, " SSD slots are neither a chunk's nor free, and ", s.ssd_held_back,
        " are held back by failed removals: ", nowhere > s.ssd_held_back ? "lost" : "miscounted"));
  }
  for (const auto& [group, q] : s.quota_groups) {
    if (q.ram_in_flight != 0 || q.ssd_in_flight != 0) {
      return absl::InternalError(absl::StrCat("quota group of ", q.quota.owner, " counts ",
                                              q.ram_in_flight, " RAM and ", q.ssd_in_flight,
                                              " SSD bytes in flight with no write running"));
    }
  }
  return s.ram ? s.ram->CheckConsistency() : absl::OkStatus();
}

}  // namespace kvc::storage
