// Rebuilding index entries from the slots themselves, at open (slot_reservation.h says
// when and why): after a crash, the reserved slots written since the index last synced;
// after damage to the index, every slot.
#include <algorithm>
#include <numeric>

#include "storage/chunk_store_impl.h"

namespace kvc::storage {

absl::Status ChunkStore::Impl::RecoverFromSlots(
    SsdClass& cls, const SlotReservation& reservation, bool whole_tier, Loaded* l,
    std::vector<ChunkKey>* stale, std::vector<std::pair<ChunkKey, IndexRecord>>* recovered) {
  auto& map = l->map;  // the records loaded so far
  auto& namespaces_of = l->namespaces;
  SsdTier& ssd = *cls.tier;
  std::vector<uint64_t> slots;
  if (whole_tier) {
    slots.resize(ssd.LaidOutSlots());  // a class holds nothing past its slabs on disk
    std::iota(slots.begin(), slots.end(), uint64_t{0});
  } else {
    slots = reservation.slots;
  }
  struct Found {
    uint64_t slot;
    SlotHeader header;
  };
  std::vector<Found> found;
  std::vector<uint64_t> unreadable;
  if (absl::Status s = ssd.Scan(
          slots,
          [&](uint64_t slot, const SlotHeader& h) {
            found.push_back({slot, h});
          },
          &unreadable);
      !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("rebuilding the index from the slots: ", s.message()));
  }
  // A slot that could not be read (after retries) costs its own chunk, not the store: a
  // store that would not open for one bad sector would lose every other chunk. Its index
  // entry, if it has one, stays (a read of it verifies the header and checksum, as every
  // read does). What it holds is unknown, its sequence too: numbering jumps far past any
  // write since the last sync, so no later chunk's sequence can equal one written there.
  if (!unreadable.empty()) {
    l->unreadable_slots += unreadable.size();
    cls.catalog->RaiseSequence(cls.catalog->next_sequence() + kSequenceGapAfterUnreadable);
    std::fprintf(stderr,
                 "kvcache storage: %zu SSD slot(s) of %llu-byte slots could not be read while "
                 "rebuilding the index (first: slot %llu); what they hold is not indexed\n",
                 unreadable.size(), static_cast<unsigned long long>(cls.slot_bytes),
                 static_cast<unsigned long long>(unreadable.front()));
  }
  // Oldest first, so that of two copies of a chunk the newer one stays.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.header.sequence < b.header.sequence; });
  // What the index says each slot read holds (only those: the index may hold millions).
  // (Of this class: other classes' slots are numbered apart.)
  std::unordered_map<uint64_t, ChunkKey> owner;
  if (whole_tier) {
    owner.reserve(map.size());
    for (const auto& [key, r] : map) {
      if (r.slot_class == cls.code) owner[cls.SlotOf(r)] = key;
    }
  } else {
    const std::unordered_set<uint64_t> read(slots.begin(), slots.end());
    for (const auto& [key, r] : map) {
      if (r.slot_class != cls.code) continue;
      if (const uint64_t slot = cls.SlotOf(r); read.contains(slot)) owner[slot] = key;
    }
  }
  std::unordered_set<uint64_t> verified(unreadable.begin(), unreadable.end());  // entries kept
  std::unordered_set<ChunkKey, ChunkKeyHash> adopted;
  std::vector<ChunkKey> dropped;
  for (const Found& f : found) {
    const SlotHeader& h = f.header;
    verified.insert(f.slot);
    // Sequences stay unique per slot across the restart, even for bytes not indexed.
    cls.catalog->RaiseSequence(h.sequence + 1);
    // Bytes older than the reservation belong to chunks the index already dealt with
    // (stored, evicted or erased before it); only later writes are new.
    if (!whole_tier && h.sequence < reservation.min_sequence) continue;
    auto ns = namespaces_of.find(h.namespace_id);
    if (ns == namespaces_of.end()) {
      if (!whole_tier) continue;
      // The damaged index lost the namespace list; the slots say each one's chunk size.
      ns = namespaces_of.emplace(h.namespace_id, h.payload_bytes).first;
    }
    if (ns->second != h.payload_bytes) continue;
    if (auto held = owner.find(f.slot); held != owner.end()) {
      const IndexRecord& r = map[held->second];
      if (held->second == h.key && r.sequence == h.sequence) continue;  // indexed already
      // The slot holds newer bytes than its entry says: the entry goes.
      dropped.push_back(held->second);
      map.erase(held->second);
      owner.erase(held);
    }
    if (auto same = map.find(h.key); same != map.end()) {
      if (same->second.sequence > h.sequence) continue;  // a newer copy is indexed
      // This one replaces it (its slot, if of another class, is free at the load).
      if (same->second.slot_class == cls.code) owner.erase(cls.SlotOf(same->second));
    }
    IndexRecord r;
    r.namespace_id = h.namespace_id;
    r.payload_bytes = h.payload_bytes;
    cls.Place(f.slot, &r);
    r.checksum = h.payload_checksum;
    r.sequence = h.sequence;
    r.parent = h.parent;
    r.origin = h.origin;
    r.created_s = r.last_access_s = h.created_s;
    r.expires_s = h.expires_s;
    map[h.key] = r;
    owner[f.slot] = h.key;
    adopted.insert(h.key);
  }
  if (whole_tier) {
    // Every slot was read: an entry whose slot did not verify names bytes that are gone.
    for (auto it = map.begin(); it != map.end();) {
      if (it->second.slot_class != cls.code || verified.contains(cls.SlotOf(it->second))) {
        ++it;
      } else {
        dropped.push_back(it->first);
        it = map.erase(it);
      }
    }
  }
  for (const ChunkKey& key : dropped) {
    if (!map.contains(key)) stale->push_back(key);  // not re-adopted elsewhere
  }
  for (const ChunkKey& key : adopted) {
    if (auto it = map.find(key); it != map.end()) recovered->emplace_back(key, it->second);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ChunkStore::Impl::LaterReservationLost(SsdClass& cls,
                                                            const SlotReservation& reservation) {
  const uint64_t slot = *reservation.next_first_slot;
  if (slot >= cls.catalog->capacity()) return false;  // the tier shrank past it
  std::optional<SlotHeader> found;
  std::vector<uint64_t> unreadable;
  if (absl::Status s = cls.tier->Scan(
          std::span<const uint64_t>(&slot, 1), [&](uint64_t, const SlotHeader& h) { found = h; },
          &unreadable);
      !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("reading the slot the reservation names next: ", s.message()));
  }
  // Unreadable, it cannot tell: assume the worst, and read every slot.
  if (!unreadable.empty()) return true;
  // Nothing is written there but under a later reservation, itself synced first; bytes
  // from before the record carry smaller sequences. (Such a chunk is never indexed: its
  // entry was committed after that later record, and an index holding the entry would
  // hold the later record too — this one would not be the last.)
  return found && found->sequence >= reservation.sequence_bound;
}

}  // namespace kvc::storage
