#include "storage/hbm_tier.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/slot_format.h"

namespace kvc::storage {

HbmLease& HbmLease::operator=(HbmLease&& o) noexcept {
  if (this != &o) {
    if (tier_ != nullptr) tier_->Unlease(slot_);
    tier_ = o.tier_;
    slot_ = o.slot_;
    offset_ = o.offset_;
    length_ = o.length_;
    checksum_ = o.checksum_;
    o.tier_ = nullptr;
  }
  return *this;
}

HbmLease::~HbmLease() {
  if (tier_ != nullptr) tier_->Unlease(slot_);
}

absl::StatusOr<std::unique_ptr<HbmTier>> HbmTier::Create(std::shared_ptr<DeviceArena> arena,
                                                         uint64_t slot_bytes) {
  if (arena == nullptr || slot_bytes == 0) {
    return absl::InvalidArgumentError("HBM tier: no arena or a zero slot size");
  }
  slot_bytes = HbmSlotBytes(slot_bytes);
  const uint64_t slots = arena->bytes() / slot_bytes;
  if (slots == 0 || slots > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("HBM tier: ", arena->bytes(),
                                                   " bytes of device memory hold ", slots,
                                                   " chunk slots of ", slot_bytes, " bytes"));
  }
  return std::unique_ptr<HbmTier>(
      new HbmTier(std::move(arena), slot_bytes, static_cast<uint32_t>(slots)));
}

HbmTier::HbmTier(std::shared_ptr<DeviceArena> arena, uint64_t slot_bytes, uint32_t slots)
    : arena_(std::move(arena)), slot_bytes_(slot_bytes), slots_(slots) {
  free_.reserve(slots);
  for (uint32_t s = slots; s > 0; --s) free_.push_back(s - 1);
  stats_.slots = slots;
}

HbmTier::~HbmTier() = default;

absl::StatusOr<uint32_t> HbmTier::TakeSlot() {
  if (!free_.empty()) {
    const uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  if (lru_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("HBM tier: all ", slots_.size(), " chunk slots are leased"));
  }
  const uint32_t s = lru_.front();
  lru_.pop_front();
  index_.erase(slots_[s].id);
  slots_[s].indexed = false;
  ++stats_.evictions;
  return s;
}

absl::Status HbmTier::Put(NamespaceId ns, const ChunkKey& key, std::span<const uint8_t> bytes) {
  return PutImpl(ns, key, bytes, nullptr);
}

absl::StatusOr<HbmLease> HbmTier::PutAndLease(NamespaceId ns, const ChunkKey& key,
                                              std::span<const uint8_t> bytes) {
  HbmLease lease;
  KVC_RETURN_IF_ERROR(PutImpl(ns, key, bytes, &lease));
  return lease;
}

HbmLease HbmTier::LeaseSlot(uint32_t s) {
  Slot& slot = slots_[s];
  if (slot.leases++ == 0) lru_.erase(slot.lru);
  HbmLease lease;
  lease.tier_ = this;
  lease.slot_ = s;
  lease.offset_ = s * slot_bytes_;
  lease.length_ = slot.length;
  lease.checksum_ = slot.checksum;
  return lease;
}

absl::Status HbmTier::PutImpl(NamespaceId ns, const ChunkKey& key, std::span<const uint8_t> bytes,
                              HbmLease* lease) {
  if (bytes.size() > slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HBM tier: a chunk of ", bytes.size(), " bytes is larger than a slot (", slot_bytes_, ")"));
  }
  const Id id{ns, key};
  uint32_t s = 0;
  {
    MutexLock lk(mu_);
    if (auto it = index_.find(id); it != index_.end()) {
      Slot& held = slots_[it->second];
      if (held.leases == 0) lru_.splice(lru_.end(), lru_, held.lru);
      if (lease != nullptr) *lease = LeaseSlot(it->second);
      return absl::OkStatus();
    }
    KVC_ASSIGN_OR_RETURN(uint32_t taken, TakeSlot());
    s = taken;
    slots_[s].leases = 1;  // the writer's: nobody takes the slot while it is written
  }
  absl::Status written = arena_->Write(s * slot_bytes_, bytes);
  const uint64_t checksum = PayloadChecksum(bytes);  // of the verified bytes put in
  MutexLock lk(mu_);
  Slot& slot = slots_[s];
  slot.leases = 0;
  if (!written.ok()) {
    free_.push_back(s);
    return written;
  }
  if (auto it = index_.find(id); it != index_.end()) {  // another Put of it won the race
    free_.push_back(s);
    if (lease != nullptr) *lease = LeaseSlot(it->second);
    return absl::OkStatus();
  }
  slot.id = id;
  slot.length = bytes.size();
  slot.checksum = checksum;
  slot.indexed = true;
  slot.lru = lru_.insert(lru_.end(), s);
  index_.emplace(id, s);
  ++stats_.puts;
  if (lease != nullptr) *lease = LeaseSlot(s);
  return absl::OkStatus();
}

absl::StatusOr<HbmLease> HbmTier::Lease(NamespaceId ns, const ChunkKey& key) {
  MutexLock lk(mu_);
  auto it = index_.find(Id{ns, key});
  if (it == index_.end()) {
    ++stats_.misses;
    return absl::NotFoundError(absl::StrCat("chunk ", key.Hex(), " is not in the HBM tier"));
  }
  ++stats_.hits;
  return LeaseSlot(it->second);
}

void HbmTier::Unlease(uint32_t s) {
  MutexLock lk(mu_);
  Slot& slot = slots_[s];
  if (--slot.leases > 0) return;
  if (slot.indexed) {
    slot.lru = lru_.insert(lru_.end(), s);  // just used: the most recent
  } else {
    free_.push_back(s);  // erased while leased
  }
}

bool HbmTier::Contains(NamespaceId ns, const ChunkKey& key) const {
  MutexLock lk(mu_);
  return index_.contains(Id{ns, key});
}

std::vector<bool> HbmTier::ContainsEach(NamespaceId ns, std::span<const ChunkKey> keys) const {
  std::vector<bool> held(keys.size());
  MutexLock lk(mu_);
  for (size_t i = 0; i < keys.size(); ++i) held[i] = index_.contains(Id{ns, keys[i]});
  return held;
}

void HbmTier::Erase(NamespaceId ns, const ChunkKey& key) {
  MutexLock lk(mu_);
  auto it = index_.find(Id{ns, key});
  if (it == index_.end()) return;
  const uint32_t s = it->second;
  index_.erase(it);
  Slot& slot = slots_[s];
  slot.indexed = false;
  if (slot.leases == 0) {
    lru_.erase(slot.lru);
    free_.push_back(s);
  }
}

uint64_t HbmTier::CountIn(const std::set<NamespaceId>& namespaces) const {
  MutexLock lk(mu_);
  uint64_t n = 0;
  for (const auto& [id, slot] : index_) n += namespaces.contains(id.ns);
  return n;
}

HbmStats HbmTier::stats() const {
  MutexLock lk(mu_);
  HbmStats s = stats_;
  s.used = index_.size();
  s.leased = 0;
  for (const Slot& slot : slots_) s.leased += slot.leases > 0 ? 1 : 0;
  return s;
}

}  // namespace kvc::storage
