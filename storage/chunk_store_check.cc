// ChunkStore::CheckConsistency: the bookkeeping of the SSD tier checked against itself —
// the index map against the eviction order, and against the slot catalog (ssd_catalog.h),
// which checks its own places and lists. A slot counted twice would let two chunks share it
// (one of them lost); a slot counted nowhere is capacity lost until the next open.
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

absl::Status ChunkStore::CheckConsistency() const {
  const Impl& s = *impl_;
  MutexLock lk(s.mu);
  KVC_RETURN_IF_ERROR(s.WaitLoaded());
  for (const auto& c : s.classes) {
    if (std::string busy = c->catalog->Busy(); !busy.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("the store is not quiet: ", busy));
    }
  }
  // Each class's catalog against the slots the map says its chunks hold.
  std::unordered_map<const Impl::SsdClass*, std::vector<uint64_t>> chunk_slots;
  for (const auto& [key, record] : s.ssd_map) {
    const Impl::SsdClass* c = s.ClassOf(record);
    if (c == nullptr) {
      return absl::InternalError(absl::StrCat("chunk ", key.Hex(), " names size class ",
                                              record.slot_class, ", which the store has not"));
    }
    chunk_slots[c].push_back(c->SlotOf(record));
    if (!s.ssd_order.Contains(key)) {
      return absl::InternalError(
          absl::StrCat("chunk ", key.Hex(), " is on SSD but not in the eviction order"));
    }
  }
  if (s.ssd_order.size() != s.ssd_map.size()) {
    return absl::InternalError(absl::StrCat("the SSD eviction order has ", s.ssd_order.size(),
                                            " chunks, the tier ", s.ssd_map.size()));
  }
  for (const auto& c : s.classes) {
    absl::Status checked = c->catalog->CheckInvariants(chunk_slots[c.get()]);
    if (!checked.ok()) {
      return absl::Status(checked.code(), absl::StrCat("size class of ", c->slot_bytes,
                                                       "-byte slots: ", checked.message()));
    }
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
