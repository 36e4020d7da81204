#include "bench/kvbench/footprint_bench.h"

#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"

namespace kvc::bench {
namespace {

// Options of a fresh store in `dir` (emptied) made as kvcached makes one.
storage::StoreOptions FreshStore(const FootprintOptions& opt, const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  storage::StoreOptions so;
  so.data_dir = dir;
  so.max_chunk_bytes = opt.max_chunk_bytes;
  so.first_class_chunk_bytes = std::min(opt.first_class_chunk_bytes, opt.max_chunk_bytes);
  return so;
}

// One size on a fresh store: `chunks` durable puts in a quota group of their own (no
// limits), then what the group is charged in each tier.
absl::StatusOr<nlohmann::json> MeasureSize(const FootprintOptions& opt, uint64_t size,
                                           std::mt19937_64& rng) {
  const std::string dir = absl::StrCat(opt.dir, "/", size);
  std::error_code ec;
  storage::StoreOptions so = FreshStore(opt, dir);
  // Room for every chunk in both tiers, whatever it is charged.
  const uint64_t slot = std::max(storage::SlotBytesFor(so.first_class_chunk_bytes),
                                 storage::SlotBytesFor(std::min(size, opt.max_chunk_bytes)));
  so.ram_bytes = (opt.chunks + 8) * slot;
  so.ssd_bytes = (opt.chunks + 64) * slot;
  so.slab_bytes = 64ull << 20;
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkStore> store, storage::ChunkStore::Open(so));
  nlohmann::json j{{"chunk_bytes", size}};
  constexpr storage::NamespaceId kNs = 1;
  if (absl::Status registered = store->RegisterNamespace(kNs, size); !registered.ok()) {
    j["refused"] = std::string(registered.message());
    store.reset();
    std::filesystem::remove_all(dir, ec);
    return j;
  }
  KVC_RETURN_IF_ERROR(store->SetQuota(1, {"footprint", 0, 0, 0}, /*must_fit=*/false));
  store->SetQuotaGroup(kNs, 1);
  std::vector<uint8_t> payload(size);
  for (uint64_t i = 0; i < opt.chunks; ++i) {
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    storage::ChunkKey key;
    for (auto& b : key.bytes) b = static_cast<uint8_t>(rng());
    KVC_RETURN_IF_ERROR(
        store->Put({kNs, key, std::nullopt, payload}, {storage::Durability::kDurable, 0}).status());
  }
  const storage::StoreStats st = store->Stats();
  const storage::QuotaUsage used = store->Usage(1);
  const auto per_payload = [&](uint64_t charged, uint64_t chunks) {
    return chunks == 0 ? 0.0 : static_cast<double>(charged) / static_cast<double>(chunks * size);
  };
  const auto per_gib = [&](uint64_t charged, uint64_t chunks) {
    return charged == 0 ? 0.0 : (1ull << 30) * static_cast<double>(chunks) / charged;
  };
  j["ram_chunks"] = st.ram_chunks;
  j["ssd_chunks"] = st.ssd_chunks;
  j["ram_charged_per_payload_byte"] = per_payload(used.ram_bytes, st.ram_chunks);
  j["ssd_charged_per_payload_byte"] = per_payload(used.ssd_bytes, st.ssd_chunks);
  j["ram_chunks_per_gib"] = per_gib(used.ram_bytes, st.ram_chunks);
  j["ssd_chunks_per_gib"] = per_gib(used.ssd_bytes, st.ssd_chunks);
  store.reset();
  std::filesystem::remove_all(dir, ec);
  return j;
}

// Slab bytes on disk under the folder (every class).
uint64_t SlabFileBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir + "/slabs", ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) bytes += it->file_size(ec);
  }
  return bytes;
}

// Every size at once on one SSD budget (no RAM tier: each durable put goes to SSD).
absl::StatusOr<nlohmann::json> MeasureMixed(const FootprintOptions& opt, std::mt19937_64& rng) {
  const std::string dir = opt.dir + "/mixed";
  std::error_code ec;
  storage::StoreOptions so = FreshStore(opt, dir);
  so.ssd_bytes = opt.mixed_budget_bytes;  // slabs as kvcached lays them out (its default size)
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkStore> store, storage::ChunkStore::Open(so));
  std::vector<uint64_t> sizes;
  for (uint64_t size : opt.chunk_bytes) {
    if (size > opt.max_chunk_bytes || storage::SlotBytesFor(size) > so.ssd_bytes / 8) continue;
    KVC_RETURN_IF_ERROR(
        store->RegisterNamespace(static_cast<storage::NamespaceId>(sizes.size() + 1), size));
    sizes.push_back(size);
  }
  nlohmann::json j{{"budget_bytes", so.ssd_bytes}, {"sizes", sizes}};
  if (sizes.empty()) return j;
  // Each size drawn with odds inverse to its bytes: about the same bytes of each.
  std::vector<double> odds;
  for (uint64_t size : sizes) odds.push_back(1.0 / static_cast<double>(size));
  std::discrete_distribution<size_t> pick(odds.begin(), odds.end());
  std::vector<uint8_t> payload(*std::max_element(sizes.begin(), sizes.end()));
  uint64_t written = 0, puts = 0;
  double fill_at_first_eviction = -1;
  while (written < 2 * so.ssd_bytes) {
    const size_t which = pick(rng);
    for (size_t b = 0; b < sizes[which]; b += 8) payload[b] = static_cast<uint8_t>(rng());
    storage::ChunkKey key;
    for (auto& b : key.bytes) b = static_cast<uint8_t>(rng());
    const uint64_t before = store->Stats().ssd_bytes;
    KVC_RETURN_IF_ERROR(store
                            ->Put({static_cast<storage::NamespaceId>(which + 1), key, std::nullopt,
                                   std::span<const uint8_t>(payload.data(), sizes[which])},
                                  {storage::Durability::kDurable, 0})
                            .status());
    written += sizes[which];
    ++puts;
    if (fill_at_first_eviction < 0 && store->Stats().ssd_evictions > 0)
      fill_at_first_eviction = static_cast<double>(before) / static_cast<double>(so.ssd_bytes);
  }
  const storage::StoreStats st = store->Stats();
  j["puts"] = puts;
  j["payload_bytes_written"] = written;
  j["fill_at_first_eviction"] = fill_at_first_eviction;
  j["fill_after"] = static_cast<double>(st.ssd_bytes) / static_cast<double>(so.ssd_bytes);
  j["slots_taken_after"] =
      static_cast<double>(st.ssd_taken_bytes) / static_cast<double>(so.ssd_bytes);
  j["slab_file_bytes_per_budget_byte"] =
      static_cast<double>(SlabFileBytes(dir)) / static_cast<double>(so.ssd_bytes);
  j["evictions"] = st.ssd_evictions;
  store.reset();
  std::filesystem::remove_all(dir, ec);
  return j;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunFootprintBench(const FootprintOptions& opt) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  nlohmann::json j{{"seed", seed},
                   {"max_chunk_bytes", opt.max_chunk_bytes},
                   {"first_class_chunk_bytes", opt.first_class_chunk_bytes},
                   {"chunks", opt.chunks},
                   {"sizes", nlohmann::json::array()}};
  for (uint64_t size : opt.chunk_bytes) {
    KVC_ASSIGN_OR_RETURN(nlohmann::json one, MeasureSize(opt, size, rng));
    j["sizes"].push_back(std::move(one));
  }
  if (opt.mixed_budget_bytes > 0) {
    KVC_ASSIGN_OR_RETURN(j["mixed"], MeasureMixed(opt, rng));
  }
  std::error_code ec;
  std::filesystem::remove_all(opt.dir, ec);
  return j;
}

std::string FootprintToText(const nlohmann::json& j) {
  std::string out = absl::StrFormat(
      "a store whose first size class is %llu-byte chunks and largest chunk %llu bytes, %llu "
      "durable chunks per size: bytes charged per payload byte (the payload itself: 1.00) and "
      "chunks per GiB, by tier\n"
      "%10s  %10s %12s  %10s %12s\n",
      j["first_class_chunk_bytes"].get<unsigned long long>(),
      j["max_chunk_bytes"].get<unsigned long long>(), j["chunks"].get<unsigned long long>(),
      "chunk", "RAM", "RAM /GiB", "SSD", "SSD /GiB");
  for (const auto& s : j["sizes"]) {
    if (s.contains("refused")) {
      absl::StrAppendFormat(&out, "%10llu  refused: %s\n",
                            s["chunk_bytes"].get<unsigned long long>(),
                            s["refused"].get<std::string>());
      continue;
    }
    absl::StrAppendFormat(
        &out, "%10llu  %9.3fx %12.0f  %9.3fx %12.0f\n", s["chunk_bytes"].get<unsigned long long>(),
        s["ram_charged_per_payload_byte"].get<double>(), s["ram_chunks_per_gib"].get<double>(),
        s["ssd_charged_per_payload_byte"].get<double>(), s["ssd_chunks_per_gib"].get<double>());
  }
  if (j.contains("mixed") && j["mixed"].contains("puts")) {
    const nlohmann::json& m = j["mixed"];
    absl::StrAppendFormat(
        &out,
        "mixed: every size above at once, about equal bytes each, %llu puts (%.2f x the %llu-byte "
        "SSD budget)\n  budget holding chunks at the first eviction: %.1f %%  (target >= 90 %%)\n"
        "  after: chunks %.1f %%, slots taken %.1f %%; slab files %.2f x the budget; %llu "
        "evictions\n",
        m["puts"].get<unsigned long long>(),
        m["payload_bytes_written"].get<double>() / m["budget_bytes"].get<double>(),
        m["budget_bytes"].get<unsigned long long>(),
        100 * m["fill_at_first_eviction"].get<double>(), 100 * m["fill_after"].get<double>(),
        100 * m["slots_taken_after"].get<double>(),
        m["slab_file_bytes_per_budget_byte"].get<double>(),
        m["evictions"].get<unsigned long long>());
  }
  return out;
}

}  // namespace kvc::bench
