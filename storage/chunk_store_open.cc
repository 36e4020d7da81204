// Opening a store (geometry, namespaces, the index loaded into memory, the tiers) and
// closing it.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

std::string EncodeNamespaces(const std::unordered_map<NamespaceId, uint64_t>& ns) {
  std::vector<std::pair<NamespaceId, uint64_t>> sorted(ns.begin(), ns.end());
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  for (const auto& [id, bytes] : sorted)
    absl::StrAppend(&out, out.empty() ? "" : ",", id, ":", bytes);
  return out;
}

namespace {

// Reads every chunk record of the index.
absl::StatusOr<std::vector<std::pair<ChunkKey, IndexRecord>>> LoadRecords(ChunkIndex& index) {
  std::vector<std::pair<ChunkKey, IndexRecord>> out;
  KVC_RETURN_IF_ERROR(
      index.ForEach([&](const ChunkKey& k, const IndexRecord& r) { out.emplace_back(k, r); }));
  return out;
}

absl::StatusOr<uint64_t> MetaNumber(ChunkIndex& index, const std::string& name, uint64_t fallback) {
  KVC_ASSIGN_OR_RETURN(std::optional<std::string> stored, index.GetMeta(name));
  if (!stored.has_value()) return fallback;
  uint64_t v = 0;
  if (!absl::SimpleAtoi(*stored, &v)) {
    return absl::DataLossError(absl::StrCat("corrupt metadata ", name, "=", *stored));
  }
  return v;
}

}  // namespace

absl::Status ChunkStore::Impl::OpenIndex(std::vector<std::pair<ChunkKey, IndexRecord>>* records) {
  const std::string dir = opt.data_dir + "/index";
  std::shared_ptr<rocksdb::FileSystem> fs = opt.power_cut ? opt.power_cut->file_system() : nullptr;
  absl::StatusOr<std::unique_ptr<ChunkIndex>> idx = ChunkIndex::Open(dir, fs);
  absl::StatusOr<std::vector<std::pair<ChunkKey, IndexRecord>>> loaded;
  if (idx.ok()) loaded = LoadRecords(**idx);
  if (idx.ok() && loaded.ok()) {
    index = *std::move(idx);
    *records = *std::move(loaded);
    return absl::OkStatus();
  }
  const bool open_failed = !idx.ok();
  const absl::Status damage = open_failed ? idx.status() : loaded.status();
  if (!absl::IsDataLoss(damage)) return damage;
  // Damaged (not merely torn at its tail by a crash): keep what still reads, then rebuild
  // from the slots, which describe themselves.
  index_damaged = true;
  ++stats.index_rebuilds;
  std::fprintf(stderr,
               "kvcache storage: the index in %s is damaged (%s); rebuilding it from the slots\n",
               dir.c_str(), std::string(damage.message()).c_str());
  idx = absl::InternalError("closed");  // closed before it is reopened or moved
  std::string moved_to;
  // A WAL that does not replay: skip its bad records. Files that do not read: start over.
  idx = ChunkIndex::OpenDamaged(dir, /*keep_records=*/open_failed, &moved_to, fs);
  if (idx.ok()) {
    loaded = LoadRecords(**idx);
    if (!loaded.ok() && moved_to.empty()) {
      idx = absl::InternalError("closed");
      idx = ChunkIndex::OpenDamaged(dir, /*keep_records=*/false, &moved_to, fs);
      if (idx.ok()) loaded = LoadRecords(**idx);
    }
  }
  if (!idx.ok()) return idx.status();
  if (!loaded.ok()) return loaded.status();
  if (!moved_to.empty()) {
    std::fprintf(stderr, "kvcache storage: the damaged index was moved to %s\n", moved_to.c_str());
  }
  index = *std::move(idx);
  *records = *std::move(loaded);
  return absl::OkStatus();
}

absl::Status ChunkStore::Impl::Open() {
  // Nobody else runs before Open returns (the writer thread starts last and waits for
  // this lock); it is held so that every field is only ever touched under its lock.
  MutexLock lk(mu);
  if (opt.data_dir.empty()) return absl::InvalidArgumentError("data folder is empty");
  const bool adopt = opt.max_chunk_bytes == 0;  // tools: take the folder's geometry
  std::error_code ec;
  std::filesystem::create_directories(opt.data_dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", opt.data_dir, ": ", ec.message()));
  std::vector<std::pair<ChunkKey, IndexRecord>> records;
  KVC_RETURN_IF_ERROR(OpenIndex(&records));

  // The slot format: the folder's; one made before format 2 says none (it is 1). Since
  // size classes (format 3) the folder says 3 and its first class keeps its own format.
  KVC_ASSIGN_OR_RETURN(std::optional<std::string> made, index->GetMeta("slot_bytes"));
  std::error_code slab_ec;
  if (!made.has_value() && !index_damaged &&
      std::filesystem::exists(opt.data_dir + "/slabs/slab-000000.dat", slab_ec)) {
    // Slabs without an index: it was lost (deleted, or never reached the disk).
    index_damaged = true;
    ++stats.index_rebuilds;
    std::fprintf(stderr,
                 "kvcache storage: %s has slabs but no index; rebuilding it from the slots\n",
                 opt.data_dir.c_str());
  }
  const uint64_t new_format = opt.slot_format != 0 ? opt.slot_format : kSlotFormatVersion;
  KVC_ASSIGN_OR_RETURN(uint64_t format,
                       MetaNumber(*index, "slot_format", made.has_value() ? 1 : new_format));
  if (SlotHeaderBytes(static_cast<uint16_t>(format)) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(opt.data_dir, " uses slot format ", format,
                                                      ", which this version cannot read"));
  }
  KVC_ASSIGN_OR_RETURN(uint64_t first_format, MetaNumber(*index, "first_class_format", format));
  if (SlotHeaderBytes(static_cast<uint16_t>(first_format)) == 0) {
    return absl::DataLossError(
        absl::StrCat("corrupt metadata first_class_format=", first_format, " in ", opt.data_dir));
  }
  legacy_format = static_cast<uint16_t>(first_format);
  // Marked format 3 before anything of a size class is written: an older version then
  // refuses the folder instead of misreading it.
  KVC_RETURN_IF_ERROR(index->PutMeta("first_class_format", std::to_string(legacy_format)));
  KVC_RETURN_IF_ERROR(index->PutMeta(
      "slot_format", std::to_string(std::max<uint64_t>(format, kSlotFormatVersion))));

  if (adopt) {
    for (auto [name, value] : {std::pair{"slot_bytes", &opt.max_chunk_bytes},
                               std::pair{"capacity_slots", &opt.ssd_bytes}}) {
      KVC_ASSIGN_OR_RETURN(std::optional<std::string> stored, index->GetMeta(name));
      if (!stored.has_value() || !absl::SimpleAtoi(*stored, value)) {
        return absl::FailedPreconditionError(
            absl::StrCat(opt.data_dir, " holds no chunk store (no ", name, ")"));
      }
    }
    opt.ssd_bytes *= opt.max_chunk_bytes;  // capacity_slots × slot_bytes (folders of before)
    KVC_ASSIGN_OR_RETURN(opt.ssd_bytes, MetaNumber(*index, "ssd_bytes", opt.ssd_bytes));
    opt.max_chunk_bytes -= SlotHeaderBytes(legacy_format);
    opt.first_class_chunk_bytes = 0;
    opt.ram_bytes = 0;
  }
  // The first class's slot size and slab geometry are fixed when the folder is made.
  const uint64_t first_chunk =
      opt.first_class_chunk_bytes != 0 ? opt.first_class_chunk_bytes : opt.max_chunk_bytes;
  slot_bytes = SlotBytesFor(first_chunk, legacy_format);
  // Every class lays its slabs out at this size (whole slots); fixed by the folder. A class
  // holds a partly used slab at its end: 1/64 of the budget (at least 16 MiB, at most
  // slab_bytes) keeps what several classes lay out past their chunks small.
  const uint64_t class_slab =
      std::min(opt.slab_bytes, std::max<uint64_t>(16ull << 20, opt.ssd_bytes / 64));
  KVC_ASSIGN_OR_RETURN(slab_bytes, MetaNumber(*index, "class_slab_bytes", class_slab));
  KVC_RETURN_IF_ERROR(index->PutMeta("class_slab_bytes", std::to_string(slab_bytes)));
  uint64_t slots_per_slab = std::max<uint64_t>(1, slab_bytes / slot_bytes);
  if (index_damaged) {
    // A rebuilt index may have lost the geometry: the first slab's size tells it.
    std::error_code size_ec;
    const uint64_t first =
        std::filesystem::file_size(opt.data_dir + "/slabs/slab-000000.dat", size_ec);
    if (!size_ec && first >= slot_bytes && first % slot_bytes == 0)
      slots_per_slab = first / slot_bytes;
  }
  for (auto [name, value] :
       {std::pair{"slot_bytes", &slot_bytes}, std::pair{"slots_per_slab", &slots_per_slab}}) {
    KVC_ASSIGN_OR_RETURN(std::optional<std::string> stored, index->GetMeta(name));
    if (!stored.has_value()) {
      KVC_RETURN_IF_ERROR(index->PutMeta(name, std::to_string(*value)));
      continue;
    }
    uint64_t v = 0;
    if (!absl::SimpleAtoi(*stored, &v) || v == 0) {
      return absl::DataLossError(
          absl::StrCat("corrupt metadata ", name, "=", *stored, " in ", opt.data_dir));
    }
    *value = v;  // the folder's geometry wins over the options (other sizes: other classes)
  }
  KVC_ASSIGN_OR_RETURN(std::optional<std::string> ns, index->GetMeta("namespaces"));
  if (ns.has_value()) {
    for (absl::string_view item : absl::StrSplit(*ns, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
      NamespaceId id = 0;
      uint64_t bytes = 0;
      if (!absl::SimpleAtoi(kv.first, &id) || !absl::SimpleAtoi(kv.second, &bytes)) {
        return absl::DataLossError(absl::StrCat("corrupt namespace list: ", *ns));
      }
      namespaces[id] = bytes;
    }
  }

  // The device budget all classes share; none if it holds not one slot of the first class.
  ssd_budget = opt.ssd_bytes / slot_bytes > 0 ? opt.ssd_bytes : 0;
  const uint64_t capacity_slots = ssd_budget / slot_bytes;  // of the first class
  KVC_RETURN_IF_ERROR(index->PutMeta("capacity_slots", std::to_string(capacity_slots)));
  KVC_RETURN_IF_ERROR(index->PutMeta("ssd_bytes", std::to_string(ssd_budget)));
  if (HasSsd()) {
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<SsdClass> first,
                         OpenClass(0, slot_bytes, slots_per_slab, legacy_format,
                                   /*lay_out_ahead=*/opt.preallocate_ssd_background));
    if (opt.preallocate_ssd) KVC_RETURN_IF_ERROR(first->tier->PreallocateAll());
    classes.push_back(std::move(first));
    // The folder's further classes: those its index lists, and any slab folder on disk
    // (a damaged index may have lost the list).
    std::set<uint64_t> sizes;
    KVC_ASSIGN_OR_RETURN(std::optional<std::string> listed, index->GetMeta("ssd_classes"));
    for (absl::string_view item : absl::StrSplit(listed.value_or(""), ',', absl::SkipEmpty())) {
      uint64_t bytes = 0;
      if (!absl::SimpleAtoi(item, &bytes) || bytes == 0 || bytes % kSlotAlignment != 0)
        return absl::DataLossError(absl::StrCat("corrupt size class list: ", *listed));
      sizes.insert(bytes);
    }
    std::error_code list_ec;
    for (const auto& entry :
         std::filesystem::directory_iterator(opt.data_dir + "/slabs", list_ec)) {
      const std::string name = entry.path().filename().string();
      uint64_t bytes = 0;
      if (name.size() > 1 && name[0] == 'c' && absl::SimpleAtoi(name.substr(1), &bytes) &&
          bytes > 0 && bytes % kSlotAlignment == 0)
        sizes.insert(bytes);
    }
    for (uint64_t bytes : sizes) {
      if (bytes > UINT32_MAX || bytes > ssd_budget) continue;  // never one of ours
      KVC_ASSIGN_OR_RETURN(std::unique_ptr<SsdClass> c, OpenFurtherClass(bytes));
      classes.push_back(std::move(c));
    }
    commits = std::make_unique<GroupCommit>(index.get());
  }

  // Load the index. Entries of no class or past their class's capacity (the budget
  // shrank) are dropped; two entries on one slot keep the newer (the older chunk's slot
  // was reused). Which record holds each slot is a flat array per class (its index + 1),
  // and the map is sized once: at open this loop is most of a restart's time beside
  // reading the records.
  KVC_CHECK(records.size() < UINT32_MAX) << records.size() << " index records";
  std::vector<std::vector<uint32_t>> holder(classes.size());
  std::vector<bool> kept(records.size(), false);
  std::vector<ChunkKey> stale;
  uint64_t sequence_seen = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& [key, r] = records[i];
    const size_t c = ClassIndexOf(r);
    auto ns_it = namespaces.find(r.namespace_id);
    if (c == classes.size() || ns_it == namespaces.end() || ns_it->second != r.payload_bytes) {
      stale.push_back(key);
      continue;
    }
    const uint64_t slot = classes[c]->SlotOf(r);
    if (slot >= classes[c]->catalog->capacity()) {
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
  ssd_map.reserve(static_cast<size_t>(std::count(kept.begin(), kept.end(), true)));
  for (size_t i = 0; i < records.size(); ++i) {
    if (kept[i]) ssd_map.emplace(records[i].first, std::move(records[i].second));
  }
  records = {};

  // Then what the index does not know yet: each class's reserved slots written after its
  // last sync (or, damaged, every slot). `used`: the slots of the chunks indexed after that.
  std::vector<std::vector<bool>> used(classes.size());
  std::vector<std::optional<uint64_t>> next_first_slot(classes.size());  // named in the records
  std::vector<std::pair<ChunkKey, IndexRecord>> recovered;
  if (HasSsd()) {
    std::vector<SlotReservation> reservations(classes.size());
    for (size_t c = 0; c < classes.size(); ++c) {
      KVC_ASSIGN_OR_RETURN(std::optional<std::string> stored,
                           index->GetMeta(classes[c]->reservation_meta));
      if (!stored.has_value()) continue;
      absl::StatusOr<SlotReservation> decoded = DecodeSlotReservation(*stored);
      if (decoded.ok()) {
        reservations[c] = *std::move(decoded);
      } else if (!index_damaged) {
        index_damaged = true;
        ++stats.index_rebuilds;
        std::fprintf(stderr, "kvcache storage: %s; rebuilding the index from every slot\n",
                     std::string(decoded.status().message()).c_str());
      }
    }
    for (size_t c = 0; c < classes.size(); ++c) {
      const SlotReservation& reservation = reservations[c];
      // Numbering resumes above every sequence written before the record (erased chunks'
      // slots included; records of earlier versions only know min_sequence).
      classes[c]->catalog->RaiseSequence(
          std::max(reservation.min_sequence, reservation.sequence_bound));
      if (index_damaged || !reservation.next_first_slot) continue;
      KVC_ASSIGN_OR_RETURN(bool lost, LaterReservationLost(*classes[c], reservation));
      if (lost) {
        index_damaged = true;
        ++stats.index_rebuilds;
        std::fprintf(stderr,
                     "kvcache storage: SSD slot %llu of %llu-byte slots holds a chunk written "
                     "under a reservation the index no longer has (its write-ahead log came back "
                     "short); rebuilding the index from every slot\n",
                     static_cast<unsigned long long>(*reservation.next_first_slot),
                     static_cast<unsigned long long>(classes[c]->slot_bytes));
      }
    }
    const size_t known_namespaces = namespaces.size();
    for (size_t c = 0; c < classes.size(); ++c) {
      KVC_RETURN_IF_ERROR(
          RecoverFromSlots(*classes[c], reservations[c], index_damaged, &stale, &recovered));
    }
    std::vector<std::pair<std::string, std::string>> meta;
    if (namespaces.size() != known_namespaces)
      meta.emplace_back("namespaces", EncodeNamespaces(namespaces));
    // Everything recovered is now in the index (synced), so each class's next reservation
    // starts from nothing — but on a slot named now, its lowest free one.
    for (const auto& [key, r] : ssd_map) {
      const SsdSlot at = SlotOf(r);
      std::vector<bool>& u = used[ClassIndexOf(r)];
      if (u.size() <= at.slot) u.resize(at.slot + 1, false);
      u[at.slot] = true;
    }
    const uint64_t next_sequence = NextSequence();
    for (size_t c = 0; c < classes.size(); ++c) {
      const std::vector<bool>& u = used[c];
      const uint64_t lowest_free =
          static_cast<uint64_t>(std::find(u.begin(), u.end(), false) - u.begin());
      if (lowest_free < classes[c]->catalog->capacity()) next_first_slot[c] = lowest_free;
      meta.emplace_back(
          classes[c]->reservation_meta,
          EncodeSlotReservation({next_sequence, {}, next_sequence, next_first_slot[c]}));
    }
    meta.emplace_back("ssd_classes", FurtherClassList());
    KVC_RETURN_IF_ERROR(index->Commit(recovered, stale, /*sync=*/true, meta));
    stats.recovered_chunks = recovered.size();
    if (!recovered.empty()) {
      std::fprintf(
          stderr, "kvcache storage: %zu chunks indexed from their slots (%s)\n", recovered.size(),
          index_damaged ? "the whole tier was read" : "written after the index's last sync");
    }
  } else if (absl::Status s = index->Commit({}, stale, true); !s.ok()) {
    return s;
  }

  int64_t max_access = 0;
  for (const auto& [key, r] : ssd_map) max_access = std::max(max_access, r.last_access_s);
  // The eviction order resumes where it was: by last access, which the index keeps in
  // seconds only, and within a second by write sequence — else chunks written in the same
  // second would come back in key order and a new chunk could go before an older one.
  std::vector<
      std::pair<std::pair<int64_t, uint64_t>, const std::pair<const ChunkKey, IndexRecord>*>>
      by_age;
  by_age.reserve(ssd_map.size());
  for (const auto& entry : ssd_map) {
    by_age.push_back({{entry.second.last_access_s, entry.second.sequence}, &entry});
  }
  std::sort(by_age.begin(), by_age.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  ssd_order.Reserve(ssd_map.size());
  int64_t access_us = 0;
  for (const auto& [age, entry] : by_age) {
    const ChunkKey* key = &entry->first;
    const IndexRecord& r = entry->second;
    access_us = std::max(access_us + 1, r.last_access_s * 1'000'000);
    ssd_order.Add(*key, r.parent, access_us, r.pin_until_s, r.expires_s, r.namespace_id,
                  ClassOf(r)->slot_bytes);  // charged the whole slot (quota.h)
    if (r.pin_until_s > 0) pins[*key] = r.pin_until_s;
  }
  access_clock = std::max(max_access * 1'000'000, access_us);
  // Chunks whose parent did not survive (evicted or dropped before the restart) are
  // unreachable: they go first.
  for (const auto& [key, r] : ssd_map) {
    if (r.parent && !ssd_map.contains(*r.parent)) ssd_order.MarkOrphansOf(*r.parent);
  }
  // Every slot not a chunk's is free (lowest on top: slabs fill in order), but the named
  // one, which waits for the next reservation.
  for (size_t c = 0; c < classes.size(); ++c)
    classes[c]->catalog->Load(used[c], next_first_slot[c]);

  std::vector<uint64_t> pool_bytes{opt.ram_bytes};
  pool_bytes.insert(pool_bytes.end(), opt.ram_pool_bytes.begin(), opt.ram_pool_bytes.end());
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<RamTier> tier,
                       RamTier::Create(first_chunk, pool_bytes, opt.prefault_ram));
  if (!tier->empty_capacity()) ram = std::move(tier);
  if (!HasSsd() && !ram)
    return absl::InvalidArgumentError("neither a RAM nor an SSD tier has room for one chunk");
  if (opt.hbm_arena != nullptr) {
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<HbmTier> t0, HbmTier::Create(opt.hbm_arena, first_chunk));
    hbm = std::move(t0);
  }

  stats.slot_bytes = slot_bytes;
  stats.ram_capacity_chunks = ram ? ram->capacity_slots() : 0;
  stats.ssd_capacity_chunks = capacity_slots;
  stats.ssd_capacity_bytes = ssd_budget;
  if (HasSsd()) {
    stats.io_backend = classes[0]->tier->backend_name();
    stats.io_fallback_reason = classes[0]->tier->fallback_reason();
    if (!stats.io_fallback_reason.empty()) {
      std::fprintf(stderr, "kvcache storage: io_uring unavailable (%s); using pread/pwrite\n",
                   stats.io_fallback_reason.c_str());
    }
  }
  writer = std::thread([this] { WriterLoop(); });
  if (ram && opt.ram_scrub_bytes_per_s > 0) scrubber = std::thread([this] { ScrubLoop(); });
  return absl::OkStatus();
}

void ChunkStore::Impl::Close() {
  {
    MutexLock lk(mu);
    stopping = true;
  }
  work.notify_all();
  if (writer.joinable()) writer.join();
  if (scrubber.joinable()) scrubber.join();
  // Persist coarse last-access times so LRU order survives the restart.
  std::vector<std::pair<ChunkKey, IndexRecord>> puts;
  {
    MutexLock lk(mu);
    for (const ChunkKey& key : access_dirty) {
      auto it = ssd_map.find(key);
      if (it != ssd_map.end()) puts.emplace_back(key, it->second);
    }
  }
  (void)index->Commit(puts, {}, /*sync=*/true);
}

}  // namespace kvc::storage
