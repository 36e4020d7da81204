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

absl::Status LoadRecords(ChunkIndex& index, std::vector<std::pair<ChunkKey, IndexRecord>>* out) {
  return index.ForEach([&](const ChunkKey& k, const IndexRecord& r) { out->emplace_back(k, r); });
}

absl::StatusOr<std::vector<std::pair<ChunkKey, IndexRecord>>> LoadRecords(ChunkIndex& index) {
  std::vector<std::pair<ChunkKey, IndexRecord>> out;
  KVC_RETURN_IF_ERROR(LoadRecords(index, &out));
  return out;
}

namespace {

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

absl::Status ChunkStore::Impl::OpenIndex(std::vector<std::pair<ChunkKey, IndexRecord>>* records,
                                         bool scan) {
  const std::string dir = opt.data_dir + "/index";
  std::shared_ptr<rocksdb::FileSystem> fs =
      seams.power_cut ? seams.power_cut->file_system() : nullptr;
  absl::StatusOr<std::unique_ptr<ChunkIndex>> idx = ChunkIndex::Open(dir, fs);
  absl::StatusOr<std::vector<std::pair<ChunkKey, IndexRecord>>> loaded =
      std::vector<std::pair<ChunkKey, IndexRecord>>();
  if (idx.ok() && scan) loaded = LoadRecords(**idx);
  if (idx.ok() && loaded.ok()) {
    index = *std::move(idx);
    *records = *std::move(loaded);
    return absl::OkStatus();
  }
  const bool open_failed = !idx.ok();
  const absl::Status damage = open_failed ? idx.status() : loaded.status();
  if (!absl::IsDataLoss(damage)) return damage;
  idx = absl::InternalError("closed");  // closed before it is reopened or moved
  return SalvageIndex(damage, open_failed, records);
}

absl::Status ChunkStore::Impl::SalvageIndex(
    const absl::Status& damage, bool open_failed,
    std::vector<std::pair<ChunkKey, IndexRecord>>* records) {
  // Damaged (not merely torn at its tail by a crash): keep what still reads, then rebuild
  // from the slots, which describe themselves.
  const std::string dir = opt.data_dir + "/index";
  std::shared_ptr<rocksdb::FileSystem> fs =
      seams.power_cut ? seams.power_cut->file_system() : nullptr;
  index_damaged = true;
  ++stats.index_rebuilds;
  std::fprintf(stderr,
               "kvcache storage: the index in %s is damaged (%s); rebuilding it from the slots\n",
               dir.c_str(), std::string(damage.message()).c_str());
  index.reset();
  std::string moved_to;
  absl::StatusOr<std::vector<std::pair<ChunkKey, IndexRecord>>> loaded;
  // A WAL that does not replay: skip its bad records. Files that do not read: start over.
  absl::StatusOr<std::unique_ptr<ChunkIndex>> idx =
      ChunkIndex::OpenDamaged(dir, /*keep_records=*/open_failed, &moved_to, fs);
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
  // What Open decides under mu and the load (below) takes without it.
  std::vector<std::pair<ChunkKey, IndexRecord>> records;
  ClassList cls;
  Loaded loaded;
  bool background = false;
  {
    // Nobody else runs before Open returns (the writer and loader threads start last); mu
    // is held so that every field is only ever touched under its lock.
    MutexLock lk(mu);
    if (opt.data_dir.empty()) return absl::InvalidArgumentError("data folder is empty");
    const bool adopt = opt.max_chunk_bytes == 0;  // tools: take the folder's geometry
    std::error_code ec;
    std::filesystem::create_directories(opt.data_dir, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("cannot create ", opt.data_dir, ": ", ec.message()));
    KVC_RETURN_IF_ERROR(OpenIndex(&records, /*scan=*/!opt.load_index_in_background));

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
    const uint64_t new_format = seams.slot_format != 0 ? seams.slot_format : kSlotFormatVersion;
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

    std::vector<uint64_t> pool_bytes{opt.ram_bytes};
    pool_bytes.insert(pool_bytes.end(), opt.ram_pool_bytes.begin(), opt.ram_pool_bytes.end());
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<RamTier> tier,
                         RamTier::Create(first_chunk, pool_bytes, opt.prefault_ram));
    if (!tier->empty_capacity()) ram = std::move(tier);
    if (!HasSsd() && !ram)
      return absl::InvalidArgumentError("neither a RAM nor an SSD tier has room for one chunk");
    if (opt.hbm_arena != nullptr) {
      KVC_ASSIGN_OR_RETURN(std::unique_ptr<HbmTier> t0,
                           HbmTier::Create(opt.hbm_arena, first_chunk));
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
    for (const auto& c : classes) cls.push_back(c.get());
    folder_meta = {{"slot_format", std::to_string(std::max<uint64_t>(format, kSlotFormatVersion))},
                   {"first_class_format", std::to_string(legacy_format)},
                   {"class_slab_bytes", std::to_string(slab_bytes)},
                   {"slot_bytes", std::to_string(slot_bytes)},
                   {"slots_per_slab", std::to_string(slots_per_slab)},
                   {"capacity_slots", std::to_string(capacity_slots)},
                   {"ssd_bytes", std::to_string(ssd_budget)},
                   {"namespaces", EncodeNamespaces(namespaces)},
                   {"ssd_classes", FurtherClassList()}};
    loaded.namespaces = namespaces;
    loaded.damaged = index_damaged;
    // A damaged index is rebuilt before Open returns: its records do not say what is stored.
    background = opt.load_index_in_background && !index_damaged;
    if (background) {
      loading_view = std::make_shared<LoadingView>();
      loading_view->namespaces = namespaces;
      loading_view->classes = cls;
    }
  }
  if (background) {
    loader = std::thread([this, cls] { LoadInBackground(cls); });
  } else {
    KVC_RETURN_IF_ERROR(BuildLoaded(std::move(records), cls, &loaded));
    MutexLock lk(mu);
    InstallLoaded(std::move(loaded));
  }
  writer = std::thread([this] { WriterLoop(); });
  if (ram && opt.ram_scrub_bytes_per_s > 0) scrubber = std::thread([this] { ScrubLoop(); });
  return absl::OkStatus();
}

void ChunkStore::Impl::Close() {
  if (loader.joinable()) loader.join();  // a load runs to its end (its commit included)
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
