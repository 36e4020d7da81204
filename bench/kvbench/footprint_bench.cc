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

// One size on a fresh store: `chunks` durable puts in a quota group of their own (no
// limits), then what the group is charged in each tier.
absl::StatusOr<nlohmann::json> MeasureSize(const FootprintOptions& opt, uint64_t size,
                                           std::mt19937_64& rng) {
  const std::string dir = absl::StrCat(opt.dir, "/", size);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  storage::StoreOptions so;
  so.data_dir = dir;
  so.max_chunk_bytes = opt.max_chunk_bytes;
  so.first_class_chunk_bytes = std::min(opt.first_class_chunk_bytes, opt.max_chunk_bytes);
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
  return out;
}

}  // namespace kvc::bench
