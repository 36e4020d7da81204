// Opening a store (geometry, namespaces, the index loaded into memory, the tiers) and
// closing it.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
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

absl::Status ChunkStore::Impl::Open() {
  if (opt.data_dir.empty()) return absl::InvalidArgumentError("data folder is empty");
  const bool adopt = opt.max_chunk_bytes == 0;  // tools: take the folder's geometry
  std::error_code ec;
  std::filesystem::create_directories(opt.data_dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", opt.data_dir, ": ", ec.message()));
  absl::StatusOr<std::unique_ptr<ChunkIndex>> idx = ChunkIndex::Open(opt.data_dir + "/index");
  if (!idx.ok()) return idx.status();
  index = *std::move(idx);

  if (adopt) {
    for (auto [name, value] : {std::pair{"slot_bytes", &opt.max_chunk_bytes},
                               std::pair{"capacity_slots", &opt.ssd_bytes}}) {
      absl::StatusOr<std::optional<std::string>> stored = index->GetMeta(name);
      if (!stored.ok()) return stored.status();
      if (!stored->has_value() || !absl::SimpleAtoi(**stored, value)) {
        return absl::FailedPreconditionError(
            absl::StrCat(opt.data_dir, " holds no chunk store (no ", name, ")"));
      }
    }
    opt.ssd_bytes *= opt.max_chunk_bytes;  // capacity_slots × slot_bytes
    opt.max_chunk_bytes -= kSlotHeaderBytes;
    opt.ram_bytes = 0;
  }
  // The slot size and slab geometry are fixed when the folder is made.
  slot_bytes = SlotBytesFor(opt.max_chunk_bytes);
  slots_per_slab = std::max<uint64_t>(1, opt.slab_bytes / slot_bytes);
  for (auto [name, value] :
       {std::pair{"slot_bytes", &slot_bytes}, std::pair{"slots_per_slab", &slots_per_slab}}) {
    absl::StatusOr<std::optional<std::string>> stored = index->GetMeta(name);
    if (!stored.ok()) return stored.status();
    if (!stored->has_value()) {
      if (absl::Status s = index->PutMeta(name, std::to_string(*value)); !s.ok()) return s;
      continue;
    }
    uint64_t v = 0;
    if (!absl::SimpleAtoi(**stored, &v) || v == 0) {
      return absl::DataLossError(
          absl::StrCat("corrupt metadata ", name, "=", **stored, " in ", opt.data_dir));
    }
    if (std::string(name) == "slot_bytes" && v != slot_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("data folder ", opt.data_dir, " was made with ", v,
                       "-byte slots; max chunk size ", opt.max_chunk_bytes, " needs ", slot_bytes));
    }
    *value = v;  // slots_per_slab: the folder's geometry wins over the option
  }
  absl::StatusOr<std::optional<std::string>> ns = index->GetMeta("namespaces");
  if (!ns.ok()) return ns.status();
  if (ns->has_value()) {
    for (absl::string_view item : absl::StrSplit(**ns, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
      NamespaceId id = 0;
      uint64_t bytes = 0;
      if (!absl::SimpleAtoi(kv.first, &id) || !absl::SimpleAtoi(kv.second, &bytes)) {
        return absl::DataLossError(absl::StrCat("corrupt namespace list: ", **ns));
      }
      namespaces[id] = bytes;
    }
  }

  const uint64_t capacity_slots = opt.ssd_bytes / slot_bytes;
  if (absl::Status s = index->PutMeta("capacity_slots", std::to_string(capacity_slots)); !s.ok())
    return s;
  if (capacity_slots > 0) {
    SsdTierOptions so;
    so.dir = opt.data_dir + "/slabs";
    so.slot_bytes = slot_bytes;
    so.capacity_slots = capacity_slots;
    so.slots_per_slab = slots_per_slab;
    so.backend = opt.io_backend;
    so.queue_depth = opt.queue_depth;
    so.lanes = opt.io_lanes;
    so.faults = opt.faults;
    absl::StatusOr<std::unique_ptr<SsdTier>> tier = SsdTier::Open(so);
    if (!tier.ok()) return tier.status();
    ssd = *std::move(tier);
    commits = std::make_unique<GroupCommit>(ssd.get(), index.get());
    if (opt.preallocate_ssd) {
      if (absl::Status s = ssd->PreallocateAll(); !s.ok()) return s;
    } else if (opt.preallocate_ssd_background) {
      ssd->PreallocateInBackground();
    }
  }

  // Load the index. Entries past the configured capacity (it shrank) are dropped;
  // two entries on one slot (impossible unless the index was edited) keep the newer.
  std::vector<bool> used(capacity_slots, false);
  std::unordered_map<uint64_t, ChunkKey> owner;
  std::vector<ChunkKey> stale;
  int64_t max_access = 0;
  absl::Status scan = index->ForEach([&](const ChunkKey& key, const IndexRecord& r) {
    const uint64_t slot = GlobalSlot(r);
    auto ns_it = namespaces.find(r.namespace_id);
    if (slot >= capacity_slots || ns_it == namespaces.end() || ns_it->second != r.payload_bytes) {
      stale.push_back(key);
      return;
    }
    if (used[slot]) {
      const ChunkKey other = owner[slot];
      if (ssd_map[other].sequence > r.sequence) {
        stale.push_back(key);
        return;
      }
      ssd_map.erase(other);
      stale.push_back(other);
    }
    used[slot] = true;
    owner[slot] = key;
    ssd_map[key] = r;
    next_sequence = std::max(next_sequence, r.sequence + 1);
    max_access = std::max(max_access, r.last_access_s);
  });
  if (!scan.ok()) return scan;
  if (absl::Status s = index->Commit({}, stale, true); !s.ok()) return s;
  access_clock = max_access * 1'000'000;
  for (const auto& [key, r] : ssd_map) {
    ssd_order.Add(key, r.parent, r.last_access_s * 1'000'000, r.pin_until_s, r.expires_s);
    if (r.pin_until_s > 0) pins[key] = r.pin_until_s;
  }
  // Chunks whose parent did not survive (evicted or dropped before the restart) are
  // unreachable: they go first.
  for (const auto& [key, r] : ssd_map) {
    if (r.parent && !ssd_map.contains(*r.parent)) ssd_order.MarkOrphansOf(*r.parent);
  }
  for (uint64_t s = capacity_slots; s-- > 0;) {
    if (!used[s]) ssd_free.push_back(s);  // lowest slot on top: slabs fill in order
  }

  std::vector<uint64_t> pool_bytes{opt.ram_bytes};
  pool_bytes.insert(pool_bytes.end(), opt.ram_pool_bytes.begin(), opt.ram_pool_bytes.end());
  absl::StatusOr<std::unique_ptr<RamTier>> tier = RamTier::Create(opt.max_chunk_bytes, pool_bytes);
  if (!tier.ok()) return tier.status();
  if (!(*tier)->empty_capacity()) ram = *std::move(tier);
  if (!ssd && !ram)
    return absl::InvalidArgumentError("neither a RAM nor an SSD tier has room for one chunk");

  stats.slot_bytes = slot_bytes;
  stats.ram_capacity_chunks = ram ? ram->capacity_slots() : 0;
  stats.ssd_capacity_chunks = capacity_slots;
  if (ssd) {
    stats.io_backend = ssd->backend_name();
    stats.io_fallback_reason = ssd->fallback_reason();
    if (!stats.io_fallback_reason.empty()) {
      std::fprintf(stderr, "kvcache storage: io_uring unavailable (%s); using pread/pwrite\n",
                   stats.io_fallback_reason.c_str());
    }
  }
  writer = std::thread([this] { WriterLoop(); });
  return absl::OkStatus();
}

void ChunkStore::Impl::Close() {
  {
    std::lock_guard lk(mu);
    stopping = true;
  }
  work.notify_all();
  if (writer.joinable()) writer.join();
  // Persist coarse last-access times so LRU order survives the restart.
  std::vector<std::pair<ChunkKey, IndexRecord>> puts;
  for (const ChunkKey& key : access_dirty) {
    auto it = ssd_map.find(key);
    if (it != ssd_map.end()) puts.emplace_back(key, it->second);
  }
  (void)index->Commit(puts, {}, /*sync=*/true);
}

}  // namespace kvc::storage
