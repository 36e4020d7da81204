#include "bench/kvbench/restart_bench.h"

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "client/client.h"
#include "kvcache/v1/kvcache.pb.h"
#include "serve/kvcached_process.h"
#include "storage/chunk_index.h"
#include "storage/slot_format.h"

namespace kvc::bench {
namespace {

using client::CacheClient;
using client::ClientOptions;
using client::RemoteNamespace;
using storage::ChunkKey;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

absl::StatusOr<std::pair<std::unique_ptr<CacheClient>, RemoteNamespace>> Connect(
    const std::string& address, uint64_t chunk_bytes) {
  ClientOptions o;
  o.address = address;
  o.timeout_ms = 120000;
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheClient> c, CacheClient::Connect(o));
  KVC_ASSIGN_OR_RETURN(RemoteNamespace ns,
                       c->RegisterKeyedNamespace("restart-model", chunk_bytes, 16));
  return std::make_pair(std::move(c), ns);
}

// One count: fill, crash, restart `reps` times, then read the index alone.
absl::StatusOr<nlohmann::json> RunCount(const RestartOptions& opt, uint64_t n, uint64_t seed) {
  const std::string dir = absl::StrCat(opt.dir, "/", n);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  // Slots of this chunk size (not the default largest chunk), room for every chunk and
  // the reservation, and little RAM: the chunks live on SSD.
  const uint64_t slot = storage::SlotBytesFor(opt.chunk_bytes);
  const uint64_t ssd_bytes = (n + n / 8 + 2048) * slot;
  std::vector<std::string> args = {"--log-level",
                                   "warn",
                                   "--max-chunk-bytes",
                                   absl::StrCat(opt.chunk_bytes),
                                   "--ram-bytes",
                                   absl::StrCat(64 * slot),
                                   "--ssd-bytes",
                                   absl::StrCat(ssd_bytes),
                                   "--lookup-keys-per-second",
                                   "0"};
  args.push_back("--load-index-in-background");
  serve::KvcachedProcess daemon(opt.kvcached, dir + "/data", args);
  // The peer in the same run: the open that loads every record before it listens.
  args.back() = "--no-load-index-in-background";
  serve::KvcachedProcess synchronous(opt.kvcached, dir + "/data", args);
  KVC_RETURN_IF_ERROR(daemon.Start());
  std::mt19937_64 rng(seed ^ n);
  std::vector<ChunkKey> keys(n);
  for (ChunkKey& k : keys) {
    for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  }
  {
    KVC_ASSIGN_OR_RETURN(auto c, Connect(daemon.address(), opt.chunk_bytes));
    constexpr uint64_t kBatch = 512;
    std::vector<uint8_t> payloads(kBatch * opt.chunk_bytes);
    const Clock::time_point fill = Clock::now();
    for (uint64_t at = 0; at < n; at += kBatch) {
      for (auto& b : payloads) b = static_cast<uint8_t>(rng());
      std::vector<client::ChunkToStore> chunks;
      for (uint64_t i = at; i < std::min(n, at + kBatch); ++i) {
        chunks.push_back({std::nullopt,
                          {},
                          std::span(payloads).subspan((i - at) * opt.chunk_bytes, opt.chunk_bytes),
                          keys[i]});
      }
      KVC_ASSIGN_OR_RETURN(client::StoreResult stored, c.first->StoreChunks(c.second, chunks));
      if (stored.stored + stored.already_present != chunks.size()) {
        return absl::InternalError(absl::StrCat("the fill stored ", stored.stored, " of ",
                                                chunks.size(), " chunks at ", at));
      }
    }
    std::fprintf(stderr, "restart: %llu chunks of %llu bytes stored in %.1f s\n",
                 static_cast<unsigned long long>(n),
                 static_cast<unsigned long long>(opt.chunk_bytes), Since(fill));
  }
  daemon.Stop(SIGKILL);
  nlohmann::json runs = nlohmann::json::array();
  // The background restarts, then one synchronous (the last run).
  for (int rep = 0; rep <= opt.reps; ++rep) {
    serve::KvcachedProcess& d = rep < opt.reps ? daemon : synchronous;
    const Clock::time_point start = Clock::now();
    KVC_RETURN_IF_ERROR(d.Start());
    const double listening = Since(start);
    KVC_ASSIGN_OR_RETURN(auto c, Connect(d.address(), opt.chunk_bytes));
    const ChunkKey& probe = keys[rng() % n];
    double first_hit = -1;
    while (Since(start) < 600) {
      KVC_ASSIGN_OR_RETURN(client::LookupResult r,
                           c.first->LookupKeys(c.second, std::span(&probe, 1)));
      if (r.matched_chunks == 1) {
        first_hit = Since(start);
        break;
      }
    }
    // Then until the index is in memory: Stats answers once it is (stores wait for it too).
    KVC_RETURN_IF_ERROR(c.first->Stats().status());
    const double loaded = Since(start);
    // Every chunk is found (a restart that loses chunks is not a faster restart).
    uint64_t found = 0;
    for (uint64_t at = 0; at < n; at += 65536) {
      KVC_ASSIGN_OR_RETURN(
          client::LookupResult r,
          c.first->LookupKeysEvery(c.second,
                                   std::span(keys).subspan(at, std::min<uint64_t>(65536, n - at))));
      for (client::Tier t : r.tiers) found += t != client::Tier::kNone;
    }
    const double all_found = Since(start);
    d.Stop(SIGKILL);
    if (found != n) {
      return absl::DataLossError(
          absl::StrCat("after restart ", rep, " only ", found, " of ", n, " chunks were found"));
    }
    nlohmann::json run = {{"listening_s", listening},
                          {"first_hit_s", first_hit},
                          {"loaded_s", loaded},
                          {"all_looked_up_s", all_found}};
    if (rep == opt.reps) {
      run["synchronous"] = true;
    }
    runs.push_back(std::move(run));
  }
  nlohmann::json sync_run = runs.back();
  runs.erase(runs.size() - 1);
  // The floor: the index's records read in this process, nothing built from them.
  const Clock::time_point read = Clock::now();
  uint64_t records = 0;
  {
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkIndex> index,
                         storage::ChunkIndex::Open(dir + "/data/index"));
    KVC_RETURN_IF_ERROR(
        index->ForEach([&](const ChunkKey&, const storage::IndexRecord&) { ++records; }));
  }
  const double index_read = Since(read);
  std::filesystem::remove_all(dir, ec);
  // The first restart is the crash's: the index's write-ahead log holds every record
  // since its last flush and is replayed (RocksDB then flushes it, so later restarts read
  // tables). Those later ones are the best case.
  const double crash_listening = runs[0]["listening_s"].get<double>();
  double best_listening = crash_listening, best_hit = runs[0]["first_hit_s"].get<double>();
  double best_loaded = runs[0]["loaded_s"].get<double>();
  for (const auto& r : runs) {
    best_listening = std::min(best_listening, r["listening_s"].get<double>());
    best_hit = std::min(best_hit, r["first_hit_s"].get<double>());
    best_loaded = std::min(best_loaded, r["loaded_s"].get<double>());
  }
  return nlohmann::json{
      {"chunks", n},
      {"records", records},
      {"runs", runs},
      {"crash_listening_s", crash_listening},
      {"crash_first_hit_s", runs[0]["first_hit_s"].get<double>()},
      {"listening_s", best_listening},
      {"first_hit_s", best_hit},
      {"crash_loaded_s", runs[0]["loaded_s"].get<double>()},
      {"loaded_s", best_loaded},
      {"synchronous", sync_run},
      {"synchronous_over_background_first_hit", sync_run["first_hit_s"].get<double>() / best_hit},
      {"us_per_chunk_to_loaded", best_loaded * 1e6 / n},
      {"index_read_s", index_read},
      {"listening_over_index_read", best_listening / index_read}};
}

}  // namespace

absl::StatusOr<nlohmann::json> RunRestartBench(const RestartOptions& opt) {
  const uint64_t seed = std::random_device{}();
  nlohmann::json j;
  j["seed"] = seed;
  j["chunk_bytes"] = opt.chunk_bytes;
  j["reps"] = opt.reps;
  j["counts"] = nlohmann::json::array();
  for (uint64_t n : opt.chunks) {
    KVC_ASSIGN_OR_RETURN(nlohmann::json one, RunCount(opt, n, seed));
    j["counts"].push_back(std::move(one));
  }
  return j;
}

std::string RestartToText(const nlohmann::json& j) {
  std::string out = absl::StrFormat(
      "kvcached restarted after SIGKILL, chunks of %llu bytes on SSD: the first restart "
      "(the index's log replayed), the best of %d (its tables read), and the floor: the "
      "index's records read alone\n",
      j["chunk_bytes"].get<unsigned long long>(), j["reps"].get<int>());
  for (const auto& c : j["counts"]) {
    absl::StrAppendFormat(
        &out,
        "  %9llu chunks: first restart listening %.3f s, first hit %.3f s, loaded %.3f s; "
        "best listening %.3f s, first hit %.3f s, loaded %.3f s (%.1f us/chunk); synchronous "
        "open: first hit %.3f s (%.1fx the background's); index read alone %.3f s\n",
        c["chunks"].get<unsigned long long>(), c["crash_listening_s"].get<double>(),
        c["crash_first_hit_s"].get<double>(), c["crash_loaded_s"].get<double>(),
        c["listening_s"].get<double>(), c["first_hit_s"].get<double>(), c["loaded_s"].get<double>(),
        c["loaded_s"].get<double>() * 1e6 / c["chunks"].get<double>(),
        c["synchronous"]["first_hit_s"].get<double>(),
        c["synchronous_over_background_first_hit"].get<double>(), c["index_read_s"].get<double>());
  }
  return out;
}

}  // namespace kvc::bench
