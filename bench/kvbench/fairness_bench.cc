#include "bench/kvbench/fairness_bench.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "client/client.h"
#include "serve/kvcached_process.h"

namespace kvc::bench {
namespace {

using client::CacheClient;
using client::ClientOptions;
using client::RemoteNamespace;
using storage::ChunkKey;

constexpr char kQuiet[] = "tok-quiet", kFlood[] = "tok-flood";
constexpr uint64_t kPageBytes = 4096;

absl::StatusOr<std::pair<std::unique_ptr<CacheClient>, RemoteNamespace>> Connect(
    const std::string& address, const std::string& token, const std::string& model,
    uint32_t page_tokens) {
  ClientOptions o;
  o.address = address;
  o.bearer_token = token;
  o.timeout_ms = 60000;
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheClient> c, CacheClient::Connect(o));
  KVC_ASSIGN_OR_RETURN(RemoteNamespace ns,
                       c->RegisterKeyedNamespace(model, kPageBytes, page_tokens));
  return std::make_pair(std::move(c), ns);
}

std::vector<ChunkKey> RandomKeys(std::mt19937_64& rng, size_t n) {
  std::vector<ChunkKey> keys(n);
  for (ChunkKey& k : keys) {
    for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  }
  return keys;
}

// One daemon, quiet alone and then under the flood; `lookup_keys_per_second` is the
// daemon's flag (negative: its default).
absl::StatusOr<nlohmann::json> RunOnce(const FairnessOptions& opt, double lookup_keys_per_second,
                                       uint64_t seed) {
  std::error_code ec;
  std::filesystem::remove_all(opt.dir, ec);
  std::filesystem::create_directories(opt.dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", opt.dir, ": ", ec.message()));
  const std::string tokens = opt.dir + "/tokens";
  std::ofstream(tokens) << kQuiet << " quiet\n" << kFlood << " flood\n";
  std::vector<std::string> args = {"--auth-tokens", tokens,     "--log-level", "warn",
                                   "--ram-bytes",   "67108864", "--ssd-bytes", "268435456"};
  if (lookup_keys_per_second >= 0) {
    args.push_back("--lookup-keys-per-second");
    args.push_back(absl::StrCat(lookup_keys_per_second));
  }
  serve::KvcachedProcess daemon(opt.kvcached, opt.dir + "/data", args);
  KVC_RETURN_IF_ERROR(daemon.Start());
  std::mt19937_64 rng(seed);
  KVC_ASSIGN_OR_RETURN(auto quiet, Connect(daemon.address(), kQuiet, "quiet-model", 16));
  // quiet's keys are stored: each of its Lookups is a hit of one key.
  const std::vector<ChunkKey> mine = RandomKeys(rng, 64);
  std::vector<uint8_t> payloads(mine.size() * kPageBytes);
  for (auto& b : payloads) b = static_cast<uint8_t>(rng());
  std::vector<client::ChunkToStore> chunks;
  for (size_t i = 0; i < mine.size(); ++i) {
    chunks.push_back(
        {std::nullopt, {}, std::span(payloads).subspan(i * kPageBytes, kPageBytes), mine[i]});
  }
  KVC_RETURN_IF_ERROR(quiet.first->StoreChunks(quiet.second, chunks).status());
  const auto quiet_lookup = [&](uint64_t i) -> absl::Status {
    KVC_ASSIGN_OR_RETURN(
        client::LookupResult r,
        quiet.first->LookupKeys(quiet.second, std::span(&mine[i % mine.size()], 1)));
    return r.matched_chunks == 1 ? absl::OkStatus()
                                 : absl::InternalError("quiet's stored key was not found");
  };
  KVC_ASSIGN_OR_RETURN(Sample alone, Loop(opt.seconds, 0, quiet_lookup));
  alone.Percentiles();

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> flood_calls{0}, flood_errors{0};
  std::vector<std::thread> flooders;
  for (int t = 0; t < opt.flooders; ++t) {
    flooders.emplace_back([&, t] {
      std::mt19937_64 r(seed ^ (0x9E37ull * (t + 1)));
      auto c = Connect(daemon.address(), kFlood, "flood-model", /*page_tokens=*/0);
      if (!c.ok()) {
        ++flood_errors;
        return;
      }
      const std::vector<ChunkKey> keys = RandomKeys(r, opt.flood_keys);
      while (!stop) {
        if (c->first->LookupKeys(c->second, keys).ok()) {
          ++flood_calls;
        } else {
          ++flood_errors;
        }
      }
    });
  }
  while (flood_calls.load() < static_cast<uint64_t>(opt.flooders) && flood_errors.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the flood is on
  }
  const uint64_t calls_before = flood_calls.load();
  absl::StatusOr<Sample> loaded = Loop(opt.seconds, 0, quiet_lookup);
  const uint64_t flood_during = flood_calls.load() - calls_before;
  stop = true;
  for (std::thread& t : flooders) t.join();
  if (!loaded.ok()) return loaded.status();
  loaded->Percentiles();
  nlohmann::json j;
  j["lookup_keys_per_second"] =
      lookup_keys_per_second >= 0 ? nlohmann::json(lookup_keys_per_second) : "default";
  j["flood_calls_per_s"] = static_cast<double>(flood_during) / loaded->seconds;
  j["flood_errors"] = flood_errors.load();
  j["quiet_alone"] = {
      {"calls", alone.lat_us.size()}, {"p50_us", alone.p50_us}, {"p99_us", alone.p99_us}};
  j["quiet_under_flood"] = {
      {"calls", loaded->lat_us.size()}, {"p50_us", loaded->p50_us}, {"p99_us", loaded->p99_us}};
  j["p99_ratio"] = alone.p99_us > 0 ? loaded->p99_us / alone.p99_us : 0;
  return j;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunFairnessBench(const FairnessOptions& opt) {
  const uint64_t seed = std::random_device{}();
  nlohmann::json j;
  j["seed"] = seed;
  j["seconds"] = opt.seconds;
  j["flooders"] = opt.flooders;
  j["flood_keys_per_call"] = opt.flood_keys;
  j["target_p99_ratio"] = 2.0;
  // The daemon as configured, and beside it (same run) one that paces nothing.
  KVC_ASSIGN_OR_RETURN(j["paced"], RunOnce(opt, opt.lookup_keys_per_second, seed));
  KVC_ASSIGN_OR_RETURN(j["unpaced"], RunOnce(opt, 0, seed));
  return j;
}

std::string FairnessToText(const nlohmann::json& j) {
  std::string out = absl::StrFormat(
      "quiet tenant, one-key Lookups, alone and under %d flooders of %d-key Lookups "
      "(target: p99 under the flood <= %.1fx alone)\n",
      j["flooders"].get<int>(), j["flood_keys_per_call"].get<int>(),
      j["target_p99_ratio"].get<double>());
  for (const char* run : {"paced", "unpaced"}) {
    const nlohmann::json& r = j[run];
    absl::StrAppendFormat(
        &out,
        "  %-8s (--lookup-keys-per-second %s): alone p50 %.0f us p99 %.0f us; flooded p50 %.0f "
        "us p99 %.0f us; flood %.1f calls/s; p99 ratio %.2f%s\n",
        run, r["lookup_keys_per_second"].dump(), r["quiet_alone"]["p50_us"].get<double>(),
        r["quiet_alone"]["p99_us"].get<double>(), r["quiet_under_flood"]["p50_us"].get<double>(),
        r["quiet_under_flood"]["p99_us"].get<double>(), r["flood_calls_per_s"].get<double>(),
        r["p99_ratio"].get<double>(),
        r["flood_errors"].get<uint64_t>()
            ? absl::StrCat(" (", r["flood_errors"].get<uint64_t>(), " flood calls refused)")
            : "");
  }
  return out;
}

}  // namespace kvc::bench
