#include "bench/kvbench/trace_bench.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "bench/trace/tier_sim.h"
#include "client/client.h"
#include "engine/spec/chunk_layout.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"
#include "serve/kvcached_process.h"

namespace kvc::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A chunk's payload, derived from its key (distinct per chunk, checkable on fetch).
void FillPayload(const storage::ChunkKey& key, uint8_t* out, size_t bytes) {
  const uint64_t base = key.Prefix64();
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t z = trace::Mix(base + i);
    std::memcpy(out + i, &z, std::min<size_t>(8, bytes - i));
  }
}

struct Totals {
  std::mutex mu;
  uint64_t prompt_tokens = 0, hit_tokens = 0, fetched_bytes = 0, stored_bytes = 0;
  uint64_t wrong_chunks = 0, store_cut_short = 0, behind_schedule = 0, errors = 0;
  std::vector<double> lookup_us, fetch_us, store_us;
  std::vector<std::pair<size_t, double>> fetch_by_prefix;  // (chunks, µs)
  double fetch_seconds = 0, store_seconds = 0;
  std::string first_error;
};

}  // namespace

absl::StatusOr<nlohmann::json> RunTraceBench(const TraceBenchOptions& o) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(o.model_config_json, "--config"));
  KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(config));
  KVC_ASSIGN_OR_RETURN(ChunkLayout layout, BuildChunkLayout(config, schedule, o.chunk_tokens));
  const uint64_t chunk_bytes = static_cast<uint64_t>(layout.chunk_bytes);
  KVC_ASSIGN_OR_RETURN(std::vector<trace::Request> requests, trace::ReadTrace(o.trace, o.limit));

  std::error_code ec;
  std::filesystem::remove_all(o.dir, ec);
  std::filesystem::create_directories(o.dir, ec);
  // Slots sized for this namespace's chunks, so capacities mean what the simulator counts.
  serve::KvcachedProcess daemon(
      o.kvcached, o.dir + "/kvcached",
      {"--ram-bytes", std::to_string(o.ram_bytes), "--ssd-bytes", std::to_string(o.ssd_bytes),
       "--max-chunk-bytes", std::to_string(chunk_bytes), "--shm-socket", "off"});
  KVC_RETURN_IF_ERROR(daemon.Start());
  const client::ClientOptions copt{.address = daemon.address(),
                                   .bearer_token = "",
                                   .timeout_ms = 120000,
                                   .tls_ca_file = "",
                                   .shm_socket = ""};
  std::vector<std::unique_ptr<client::CacheClient>> clients;
  for (int c = 0; c < std::max(1, o.concurrency); ++c) {
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<client::CacheClient> cl,
                         client::CacheClient::Connect(copt));
    clients.push_back(std::move(cl));
  }
  KVC_ASSIGN_OR_RETURN(
      client::RemoteNamespace ns,
      clients[0]->RegisterNamespace(o.model_config_json, "kvbench-trace", o.chunk_tokens));
  const auto durability =
      o.ssd_bytes > 0 ? client::Durability::kDurable : client::Durability::kMemory;

  Totals t;
  std::atomic<size_t> next{0};
  const auto start = Clock::now();
  const double first_arrival = requests.empty() ? 0 : requests.front().arrival_s;
  auto worker = [&](client::CacheClient& client) {
    std::vector<uint8_t> buf;
    for (size_t i = next++; i < requests.size(); i = next++) {
      const trace::Request& r = (requests)[i];
      if (o.speedup > 0) {
        const auto due =
            start + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>((r.arrival_s - first_arrival) / o.speedup));
        std::this_thread::sleep_until(due);
        if (Clock::now() - due > std::chrono::milliseconds(100)) {
          std::lock_guard lk(t.mu);
          ++t.behind_schedule;
        }
      }
      const std::vector<uint32_t> tokens =
          trace::PromptTokens(r, static_cast<uint32_t>(config.vocab_size));
      auto t0 = Clock::now();
      absl::StatusOr<client::LookupResult> found = client.Lookup(ns, tokens);
      auto t1 = Clock::now();
      absl::StatusOr<size_t> got = size_t{0};
      if (found.ok() && found->matched_chunks > 0) {
        buf.resize(found->matched_chunks * chunk_bytes);
        got = client.Fetch(ns, std::span(found->keys).first(found->matched_chunks), buf);
      }
      auto t2 = Clock::now();
      uint64_t wrong = 0;
      std::vector<uint8_t> want(chunk_bytes);
      if (found.ok() && got.ok()) {
        for (size_t k = 0; k < *got; ++k) {
          FillPayload(found->keys[k], want.data(), chunk_bytes);
          if (std::memcmp(want.data(), buf.data() + k * chunk_bytes, chunk_bytes) != 0) ++wrong;
        }
      }
      // Store the new whole chunks, after the reused prefix.
      absl::Status stored = absl::OkStatus();
      size_t new_chunks = 0;
      auto t3 = Clock::now();
      if (found.ok() && got.ok() && *got < found->keys.size()) {
        new_chunks = found->keys.size() - *got;
        std::vector<uint8_t> payloads(new_chunks * chunk_bytes);
        for (size_t k = 0; k < new_chunks; ++k)
          FillPayload(found->keys[*got + k], payloads.data() + k * chunk_bytes, chunk_bytes);
        const std::optional<storage::ChunkKey> parent =
            *got > 0 ? std::optional(found->keys[*got - 1]) : std::nullopt;
        const size_t first_token = *got * static_cast<size_t>(o.chunk_tokens);
        stored = client
                     .Store(ns, parent,
                            std::span(tokens).subspan(
                                first_token, new_chunks * static_cast<size_t>(o.chunk_tokens)),
                            payloads, durability)
                     .status();
      }
      auto t4 = Clock::now();
      std::lock_guard lk(t.mu);
      t.prompt_tokens += static_cast<uint64_t>(r.input_tokens);
      if (!found.ok() || !got.ok()) {
        ++t.errors;
        if (t.first_error.empty())
          t.first_error = std::string((found.ok() ? got.status() : found.status()).message());
        continue;
      }
      if (absl::IsFailedPrecondition(stored)) {
        ++t.store_cut_short;  // a parent evicted meanwhile, as the simulator models
      } else if (!stored.ok()) {
        ++t.errors;
        if (t.first_error.empty()) t.first_error = std::string(stored.message());
      }
      t.hit_tokens += *got * static_cast<uint64_t>(o.chunk_tokens);
      t.wrong_chunks += wrong;
      t.fetched_bytes += *got * chunk_bytes;
      t.stored_bytes += new_chunks * chunk_bytes;
      const auto us = [](auto a, auto b) {
        return std::chrono::duration<double, std::micro>(b - a).count();
      };
      t.lookup_us.push_back(us(t0, t1));
      if (*got > 0) {
        t.fetch_us.push_back(us(t1, t2));
        t.fetch_by_prefix.emplace_back(*got, us(t1, t2));
        t.fetch_seconds += us(t1, t2) / 1e6;
      }
      if (new_chunks > 0) {
        t.store_us.push_back(us(t3, t4));
        t.store_seconds += us(t3, t4) / 1e6;
      }
    }
  };
  std::vector<std::thread> threads;
  for (auto& c : clients) threads.emplace_back(worker, std::ref(*c));
  for (auto& th : threads) th.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  clients.clear();
  daemon.Stop(SIGTERM);
  std::filesystem::remove_all(o.dir, ec);

  trace::SimConfig sc{o.chunk_tokens, chunk_bytes, 0, static_cast<double>(o.ram_bytes),
                      static_cast<double>(o.ssd_bytes)};
  const trace::SimReport sim =
      trace::Simulate(requests, sc, static_cast<uint32_t>(config.vocab_size), storage::ChunkKey{});
  const double prompt = std::max<double>(1, static_cast<double>(t.prompt_tokens));
  nlohmann::json by_prefix = nlohmann::json::array();
  {
    // Fetch latency by prefix length, in power-of-two buckets of chunks.
    std::map<size_t, std::vector<double>> buckets;
    for (const auto& [chunks, us] : t.fetch_by_prefix)
      buckets[size_t{1} << static_cast<int>(std::floor(std::log2(static_cast<double>(chunks))))]
          .push_back(us);
    for (const auto& [lo, v] : buckets) {
      by_prefix.push_back({{"chunks_from", lo},
                           {"chunks_below", lo * 2},
                           {"fetches", v.size()},
                           {"p50_us", Percentile(v, 0.5)},
                           {"p99_us", Percentile(v, 0.99)}});
    }
  }
  return nlohmann::json{
      {"trace", o.trace},
      {"requests", requests.size()},
      {"chunk_tokens", o.chunk_tokens},
      {"chunk_bytes", chunk_bytes},
      {"ram_bytes", o.ram_bytes},
      {"ssd_bytes", o.ssd_bytes},
      {"speedup", o.speedup},
      {"concurrency", o.concurrency},
      {"wall_seconds", wall_s},
      {"prompt_tokens", t.prompt_tokens},
      {"hit_tokens", t.hit_tokens},
      {"hit_rate", static_cast<double>(t.hit_tokens) / prompt},
      {"simulated_hit_tokens", sim.hit_tokens},
      {"simulated_hit_rate", sim.hit_rate},
      {"disagreement",
       std::abs(static_cast<double>(t.hit_tokens) - static_cast<double>(sim.hit_tokens)) / prompt},
      {"wrong_chunks", t.wrong_chunks},
      {"errors", t.errors},
      {"first_error", t.first_error},
      {"stores_cut_short", t.store_cut_short},
      {"behind_schedule", t.behind_schedule},
      {"fetch_gbps", t.fetch_seconds > 0 ? t.fetched_bytes / t.fetch_seconds / 1e9 : 0},
      {"store_gbps", t.store_seconds > 0 ? t.stored_bytes / t.store_seconds / 1e9 : 0},
      {"lookup_p50_us", Percentile(t.lookup_us, 0.5)},
      {"lookup_p99_us", Percentile(t.lookup_us, 0.99)},
      {"fetch_p50_us", Percentile(t.fetch_us, 0.5)},
      {"fetch_p99_us", Percentile(t.fetch_us, 0.99)},
      {"store_p50_us", Percentile(t.store_us, 0.5)},
      {"store_p99_us", Percentile(t.store_us, 0.99)},
      {"fetch_latency_by_prefix", by_prefix},
      {"simulated", trace::ReportToJson(sim)}};
}

std::string TraceBenchToText(const nlohmann::json& j) {
  std::string out = absl::StrFormat(
      "%d requests of %s replayed in %.1f s (speedup %g, %d in flight), %d-token chunks of %d B\n"
      "hit rate %.4f; the simulator at the same capacities %.4f (differ by %.4f of prompt "
      "tokens)\n"
      "wrong chunks %d, errors %d, stores cut short %d, behind schedule %d\n"
      "fetch %.3f GB/s (p50 %.0f us, p99 %.0f us); store %.3f GB/s (p50 %.0f us, p99 %.0f us)\n"
      "lookup p50 %.0f us, p99 %.0f us\n",
      j["requests"].get<int64_t>(), j["trace"].get<std::string>(), j["wall_seconds"].get<double>(),
      j["speedup"].get<double>(), j["concurrency"].get<int>(), j["chunk_tokens"].get<int64_t>(),
      j["chunk_bytes"].get<int64_t>(), j["hit_rate"].get<double>(),
      j["simulated_hit_rate"].get<double>(), j["disagreement"].get<double>(),
      j["wrong_chunks"].get<int64_t>(), j["errors"].get<int64_t>(),
      j["stores_cut_short"].get<int64_t>(), j["behind_schedule"].get<int64_t>(),
      j["fetch_gbps"].get<double>(), j["fetch_p50_us"].get<double>(),
      j["fetch_p99_us"].get<double>(), j["store_gbps"].get<double>(),
      j["store_p50_us"].get<double>(), j["store_p99_us"].get<double>(),
      j["lookup_p50_us"].get<double>(), j["lookup_p99_us"].get<double>());
  out += "fetch latency by prefix length (chunks):\n";
  for (const auto& b : j["fetch_latency_by_prefix"]) {
    absl::StrAppendFormat(&out, "  [%4d, %4d)  %6d fetches  p50 %8.0f us  p99 %8.0f us\n",
                          b["chunks_from"].get<int64_t>(), b["chunks_below"].get<int64_t>(),
                          b["fetches"].get<int64_t>(), b["p50_us"].get<double>(),
                          b["p99_us"].get<double>());
  }
  if (!j["first_error"].get<std::string>().empty())
    out += "first error: " + j["first_error"].get<std::string>() + "\n";
  return out;
}

}  // namespace kvc::bench
