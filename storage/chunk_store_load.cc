// Loading the index into memory (docs/storage.md, "Restart"): the records become the SSD
// tier's map, eviction order and catalogs — built without mu, then installed in one step —
// by Open itself or, with StoreOptions::load_index_in_background, by a loader thread while
// Lookup and Get answer from the index on disk.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "base/check.h"
#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

size_t ChunkStore::Impl::ClassIndexIn(const ClassList& cls, const IndexRecord& r) {
  size_t c = 0;
  while (c < cls.size() && cls[c]->code != r.slot_class) ++c;
  return c;
}

std::string ChunkStore::Impl::FurtherClassListOf(const ClassList& cls) {
  std::string list;
  for (const SsdClass* c : cls) {
    if (c->code != 0) absl::StrAppend(&list, list.empty() ? "" : ",", c->slot_bytes);
  }
  return list;
}

absl::Status ChunkStore::Impl::BuildLoaded(std::vector<std::pair<ChunkKey, IndexRecord>> records,
                                           const ClassList& cls, Loaded* out) {
  Loaded& l = *out;
  // Load the index. Entries of no class or past their class's capacity (the budget
  // shrank) are dropped; two entries on one slot keep the newer (the older chunk's slot
  // was reused). Which record holds each slot is a flat array per class (its index + 1),
  // and the map is sized once: at open this loop is most of a restart's time beside
  // reading the records.
  KVC_CHECK(records.size() < UINT32_MAX) << records.size() << " index records";
  std::vector<std::vector<uint32_t>> holder(cls.size());
  std::vector<bool> kept(records.size(), false);
  std::vector<ChunkKey> stale;
  uint64_t sequence_seen = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& [key, r] = records[i];
    const size_t c = ClassIndexIn(cls, r);
    auto ns_it = l.namespaces.find(r.namespace_id);
    if (c == cls.size() || ns_it == l.namespaces.end() || ns_it->second != r.payload_bytes) {
      stale.push_back(key);
      continue;
    }
    const uint64_t slot = cls[c]->SlotOf(r);
    if (slot >= cls[c]->catalog->capacity()) {
      stale.push_back(key);
      continue;
    }
    std::vector<uint32_t>& held_by = holder[c];
    if (held_by.size() <= slot) held_by.resize(slot + 1, 0);
    if (uint32_t& held = held_by[slot]; held != 0) {
      if (records[held - 1].second.sequence > r.sequence) {
        stale.push_back(key);
        continue;
      }
      kept[held - 1] = false;
      stale.push_back(records[held - 1].first);
    }
    held_by[slot] = static_cast<uint32_t>(i + 1);
    kept[i] = true;
    sequence_seen = std::max(sequence_seen, r.sequence + 1);
  }
  holder = {};
  sequence->store(std::max(sequence->load(), sequence_seen));
  l.map.reserve(static_cast<size_t>(std::count(kept.begin(), kept.end(), true)));
  for (size_t i = 0; i < records.size(); ++i) {
    if (kept[i]) l.map.emplace(records[i].first, std::move(records[i].second));
  }
  records = {};

  // Then what the index does not know yet: each class's reserved slots written after its
  // last sync (or, damaged, every slot). `used`: the slots of the chunks indexed after that.
  std::vector<std::vector<bool>> used(cls.size());
  std::vector<std::optional<uint64_t>> next_first_slot(cls.size());  // named in the records
  std::vector<std::pair<ChunkKey, IndexRecord>> recovered;
  if (HasSsd()) {
    std::vector<SlotReservation> reservations(cls.size());
    for (size_t c = 0; c < cls.size(); ++c) {
      KVC_ASSIGN_OR_RETURN(std::optional<std::string> stored,
                           index->GetMeta(cls[c]->reservation_meta));
      if (!stored.has_value()) continue;
      absl::StatusOr<SlotReservation> decoded = DecodeSlotReservation(*stored);
      if (decoded.ok()) {
        reservations[c] = *std::move(decoded);
      } else if (!l.damaged) {
        l.damaged = true;
        ++l.rebuilds;
        std::fprintf(stderr, "kvcache storage: %s; rebuilding the index from every slot\n",
                     std::string(decoded.status().message()).c_str());
      }
    }
    for (size_t c = 0; c < cls.size(); ++c) {
      const SlotReservation& reservation = reservations[c];
      // Numbering resumes above every sequence written before the record (erased chunks'
      // slots included; records of earlier versions only know min_sequence).
      cls[c]->catalog->RaiseSequence(
          std::max(reservation.min_sequence, reservation.sequence_bound));
      if (l.damaged || !reservation.next_first_slot) continue;
      KVC_ASSIGN_OR_RETURN(bool lost, LaterReservationLost(*cls[c], reservation));
      if (lost) {
        l.damaged = true;
        ++l.rebuilds;
        std::fprintf(stderr,
                     "kvcache storage: SSD slot %llu of %llu-byte slots holds a chunk written "
                     "under a reservation the index no longer has (its write-ahead log came back "
                     "short); rebuilding the index from every slot\n",
                     static_cast<unsigned long long>(*reservation.next_first_slot),
                     static_cast<unsigned long long>(cls[c]->slot_bytes));
      }
    }
    const size_t known_namespaces = l.namespaces.size();
    for (size_t c = 0; c < cls.size(); ++c) {
      KVC_RETURN_IF_ERROR(
          RecoverFromSlots(*cls[c], reservations[c], l.damaged, &l, &stale, &recovered));
    }
    std::vector<std::pair<std::string, std::string>> meta;
    if (l.namespaces.size() != known_namespaces)
      meta.emplace_back("namespaces", EncodeNamespaces(l.namespaces));
    // Everything recovered is now in the index (synced), so each class's next reservation
    // starts from nothing — but on a slot named now, its lowest free one.
    for (const auto& [key, r] : l.map) {
      const size_t c = ClassIndexIn(cls, r);
      const uint64_t slot = cls[c]->SlotOf(r);
      std::vector<bool>& u = used[c];
      if (u.size() <= slot) u.resize(slot + 1, false);
      u[slot] = true;
    }
    const uint64_t next_sequence = NextSequence();
    for (size_t c = 0; c < cls.size(); ++c) {
      const std::vector<bool>& u = used[c];
      const uint64_t lowest_free =
          static_cast<uint64_t>(std::find(u.begin(), u.end(), false) - u.begin());
      if (lowest_free < cls[c]->catalog->capacity()) next_first_slot[c] = lowest_free;
      meta.emplace_back(
          cls[c]->reservation_meta,
          EncodeSlotReservation({next_sequence, {}, next_sequence, next_first_slot[c]}));
    }
    meta.emplace_back("ssd_classes", FurtherClassListOf(cls));
    KVC_RETURN_IF_ERROR(index->Commit(recovered, stale, /*sync=*/true, meta));
    l.recovered = recovered.size();
    if (!recovered.empty()) {
      std::fprintf(stderr, "kvcache storage: %zu chunks indexed from their slots (%s)\n",
                   recovered.size(),
                   l.damaged ? "the whole tier was read" : "written after the index's last sync");
    }
  } else if (absl::Status s = index->Commit({}, stale, true); !s.ok()) {
    return s;
  }

  int64_t max_access = 0;
  for (const auto& [key, r] : l.map) max_access = std::max(max_access, r.last_access_s);
  // The eviction order resumes where it was: by last access, which the index keeps in
  // seconds only, and within a second by write sequence — else chunks written in the same
  // second would come back in key order and a new chunk could go before an older one.
  std::vector<
      std::pair<std::pair<int64_t, uint64_t>, const std::pair<const ChunkKey, IndexRecord>*>>
      by_age;
  by_age.reserve(l.map.size());
  for (const auto& entry : l.map) {
    by_age.push_back({{entry.second.last_access_s, entry.second.sequence}, &entry});
  }
  std::sort(by_age.begin(), by_age.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  l.order.Reserve(l.map.size());
  int64_t access_us = 0;
  for (const auto& [age, entry] : by_age) {
    const ChunkKey* key = &entry->first;
    const IndexRecord& r = entry->second;
    access_us = std::max(access_us + 1, r.last_access_s * 1'000'000);
    l.order.Add(*key, r.parent, access_us, r.pin_until_s, r.expires_s, r.namespace_id,
                cls[ClassIndexIn(cls, r)]->slot_bytes);  // charged the whole slot (quota.h)
    if (r.pin_until_s > 0) l.pins[*key] = r.pin_until_s;
  }
  l.access_clock = std::max(max_access * 1'000'000, access_us);
  // Chunks whose parent did not survive (evicted or dropped before the restart) are
  // unreachable: they go first.
  for (const auto& [key, r] : l.map) {
    if (r.parent && !l.map.contains(*r.parent)) l.order.MarkOrphansOf(*r.parent);
  }
  // Every slot not a chunk's is free (lowest on top: slabs fill in order), but the named
  // one, which waits for the next reservation.
  for (size_t c = 0; c < cls.size(); ++c) cls[c]->catalog->Load(used[c], next_first_slot[c]);
  return absl::OkStatus();
}

void ChunkStore::Impl::InstallLoaded(Loaded&& l) {
  ssd_map = std::move(l.map);
  ssd_order = std::move(l.order);
  pins = std::move(l.pins);
  access_clock = std::max(access_clock, l.access_clock);
  for (const auto& [id, bytes] : l.namespaces) namespaces.emplace(id, bytes);  // rebuilt ones
  index_damaged = l.damaged;
  stats.index_rebuilds += l.rebuilds;
  stats.recovered_chunks = l.recovered;
  stats.unreadable_slots_at_open = l.unreadable_slots;
  stats.index_load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_at).count();
  loading = false;
  loading_view.reset();  // readers still inside keep theirs
  loaded_cv.notify_all();
}

void ChunkStore::Impl::LoadInBackground(ClassList cls) {
  if (seams.before_index_load) seams.before_index_load();
  Loaded loaded;
  std::shared_ptr<LoadingView> view;
  {
    MutexLock lk(mu);
    loaded.namespaces = namespaces;
    view = loading_view;
  }
  std::vector<std::pair<ChunkKey, IndexRecord>> records;
  absl::Status s = LoadRecords(*index, &records);
  if (absl::IsDataLoss(s)) {
    // The index is damaged: lookups stop reading it (they answer misses), and once none is
    // inside it is salvaged and rebuilt from every slot, as an open that found it so does.
    view->serving = false;
    while (view->readers.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    MutexLock lk(mu);
    records.clear();
    s = SalvageIndex(s, /*open_failed=*/false, &records);
    // The salvaged index may be a new one: the folder's metadata again, with the
    // namespaces registered since the open.
    std::vector<std::pair<std::string, std::string>> meta = folder_meta;
    for (auto& [name, value] : meta) {
      if (name == "namespaces") value = EncodeNamespaces(namespaces);
    }
    if (s.ok()) s = index->Commit({}, {}, /*sync=*/true, meta);
    loaded.damaged = true;
    loaded.rebuilds = 0;  // SalvageIndex counted it
  }
  // A read or commit that fails (an I/O error) fails the attempt, not the store: the
  // records are read again and the load tried again, as a restart would (a synchronous
  // open fails Open).
  constexpr int kAttempts = 5;
  for (int attempt = 1; s.ok(); ++attempt) {
    Loaded built = loaded;  // its namespaces and damage, before any attempt
    s = BuildLoaded(std::move(records), cls, &built);
    if (s.ok()) {
      loaded = std::move(built);
      break;
    }
    if (attempt == kAttempts || absl::IsDataLoss(s)) break;
    std::fprintf(stderr, "kvcache storage: loading the index (attempt %d) failed: %s; again\n",
                 attempt, std::string(s.message()).c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
    records.clear();
    s = LoadRecords(*index, &records);
  }
  MutexLock lk(mu);
  if (!s.ok()) {
    std::fprintf(stderr, "kvcache storage: loading the index failed: %s\n",
                 std::string(s.message()).c_str());
    load_error =
        absl::Status(s.code(), absl::StrCat("the store could not load its index: ", s.message()));
    loaded = Loaded();
    loaded.namespaces = namespaces;
  }
  InstallLoaded(std::move(loaded));
}

std::optional<IndexRecord> ChunkStore::Impl::RecordWhileLoading(const LoadingView& v,
                                                                NamespaceId ns,
                                                                const ChunkKey& key) const {
  absl::StatusOr<std::optional<IndexRecord>> got = index->Get(key);
  if (!got.ok() || !got->has_value()) return std::nullopt;
  const IndexRecord& r = **got;
  // What the load keeps: a known namespace's chunk of its size, in a slot of a class.
  auto it = v.namespaces.find(r.namespace_id);
  if (r.namespace_id != ns || it == v.namespaces.end() || it->second != r.payload_bytes)
    return std::nullopt;
  const size_t c = ClassIndexIn(v.classes, r);
  if (c == v.classes.size() || v.classes[c]->SlotOf(r) >= v.classes[c]->catalog->capacity())
    return std::nullopt;
  if (r.expires_s != 0 && r.expires_s <= NowS()) return std::nullopt;
  return **got;
}

std::vector<Tier> ChunkStore::Impl::LookupWhileLoading(LoadingView& v, NamespaceId ns,
                                                       std::span<const ChunkKey> keys,
                                                       bool leading_only) const {
  std::vector<Tier> tiers(keys.size(), Tier::kNone);
  ++v.readers;
  if (v.serving) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (RecordWhileLoading(v, ns, keys[i]).has_value()) {
        tiers[i] = Tier::kSsd;
      } else if (leading_only) {
        break;
      }
    }
  }
  --v.readers;
  return tiers;
}

void ChunkStore::Impl::GetWhileLoading(LoadingView& v, NamespaceId ns,
                                       std::span<const ChunkKey> keys,
                                       std::span<const std::span<uint8_t>> outs,
                                       std::span<const size_t> todo, bool outs_have_read_room,
                                       std::vector<absl::Status>* status,
                                       std::vector<Tier>* served_from) const {
  std::vector<SlotRead> reads;
  std::vector<SsdClass*> read_class;
  std::vector<size_t> read_index;
  ++v.readers;
  for (size_t i : todo) {
    std::optional<IndexRecord> r;
    if (v.serving) r = RecordWhileLoading(v, ns, keys[i]);
    if (!r.has_value()) {
      (*status)[i] = absl::NotFoundError(absl::StrCat(Where(keys[i]), " is not cached"));
      continue;
    }
    // No write runs before the load ends; one that starts after it may reuse the slot,
    // and then the header read does not match what is expected here: a miss.
    SlotHeader expect;
    expect.namespace_id = ns;
    expect.payload_bytes = r->payload_bytes;
    expect.key = keys[i];
    expect.payload_checksum = r->checksum;
    expect.sequence = r->sequence;
    SsdClass* c = v.classes[ClassIndexIn(v.classes, *r)];
    reads.push_back({c->SlotOf(*r), expect, outs[i], outs_have_read_room});
    read_class.push_back(c);
    read_index.push_back(i);
  }
  --v.readers;
  std::vector<absl::Status> io;
  if (!reads.empty()) io = ReadSlots(reads, read_class);
  for (size_t k = 0; k < reads.size(); ++k) {
    const size_t i = read_index[k];
    if (io[k].ok()) {
      (*status)[i] = absl::OkStatus();
      if (served_from != nullptr) (*served_from)[i] = Tier::kSsd;
    } else if (absl::IsDataLoss(io[k])) {
      (*status)[i] = absl::NotFoundError(io[k].message());  // never bytes that do not verify
    } else {
      (*status)[i] = io[k];
    }
  }
}

}  // namespace kvc::storage
