// T0 inside the store: device-memory copies of chunks that RAM or SSD holds.
//
// HbmTier (hbm_tier.h) keeps the copies, their LRU and their leases; the store decides
// what goes in — only verified bytes: a chunk read through Get (checksum checked), or the
// bytes a Put just stored — and takes a copy out whenever its chunk leaves the store
// (LeftStore). Copies are made without the store's lock (a device copy takes time), so an
// erase may run in between; the copy is then checked against the store under the lock and
// dropped if its chunk is gone (KeepHbmCopy), which keeps T0 a subset of the store.
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

const DeviceArena* ChunkStore::hbm_arena() const {
  return impl_->hbm ? &impl_->hbm->arena() : nullptr;
}

absl::StatusOr<HbmLease> ChunkStore::LeaseHbm(NamespaceId ns, const ChunkKey& key) {
  Impl& s = *impl_;
  if (!s.hbm) {
    return absl::FailedPreconditionError("this store has no HBM tier (T0)");
  }
  uint64_t chunk_bytes = 0;
  {
    MutexLock lk(s.mu);
    auto it = s.namespaces.find(ns);
    if (it == s.namespaces.end()) {
      return absl::NotFoundError(absl::StrCat("namespace ", ns, " is not registered"));
    }
    chunk_bytes = it->second;
    if (!s.Holds(ns, key)) {
      return absl::NotFoundError(absl::StrCat(s.Where(key), " is not cached"));
    }
  }
  // T0's slots have one size (the first class's chunk): a larger chunk is served from RAM
  // or SSD only — a miss here, as for any chunk T0 has no room for.
  if (chunk_bytes > s.hbm->slot_bytes()) {
    return absl::NotFoundError(absl::StrCat("a chunk of ", chunk_bytes,
                                            " bytes is larger than the HBM tier's slots (",
                                            s.hbm->slot_bytes(), ")"));
  }
  absl::StatusOr<HbmLease> lease = s.hbm->Lease(ns, key);
  if (lease.ok() || !absl::IsNotFound(lease.status())) return lease;
  // A miss: read the chunk from RAM or SSD (verified; a bad copy is a miss there too) and
  // copy it in. The staging buffer is per thread: a lease call's promotions reuse it.
  thread_local std::vector<uint8_t> staged;
  staged.resize(chunk_bytes);
  std::span<uint8_t> outs[] = {staged};
  const std::vector<absl::Status> got =
      GetBatchImpl(ns, std::span(&key, 1), outs, nullptr, /*verify_ram=*/true);
  KVC_RETURN_IF_ERROR(got[0]);
  lease = s.hbm->PutAndLease(ns, key, staged);
  if (!lease.ok()) return lease;
  MutexLock lk(s.mu);
  if (!s.KeepHbmCopy(ns, key)) {
    return absl::NotFoundError(absl::StrCat(s.Where(key), " was erased while it was promoted"));
  }
  ++s.stats.hbm_promotions;
  return lease;
}

void ChunkStore::Impl::WriteThroughHbm(std::span<const PutRequest> requests,
                                       const std::vector<absl::StatusOr<PutResult>>& results) {
  mu.unlock();
  std::vector<size_t> copied;
  for (size_t i = 0; i < requests.size(); ++i) {
    // Only bytes this call stored: an already-present chunk keeps its own (copied on a read).
    if (!results[i].ok() || results[i]->already_present) continue;
    const PutRequest& r = requests[i];
    // A full T0 (every slot leased) only means the chunk is copied in on a later read.
    std::vector<uint8_t> gathered;  // a payload in pieces, made one for the device copy
    std::optional<std::span<const uint8_t>> bytes = r.payload.contiguous();
    if (!bytes) {
      gathered.resize(r.payload.size());
      r.payload.CopyTo(gathered.data());
      bytes = gathered;
    }
    if (hbm->Put(r.namespace_id, r.key, *bytes).ok()) copied.push_back(i);
  }
  mu.lock();
  for (size_t i : copied) (void)KeepHbmCopy(requests[i].namespace_id, requests[i].key);
}

}  // namespace kvc::storage
