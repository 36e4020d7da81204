#include "bench/kvbench/soak.h"

#include <dirent.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/splitmix.h"
#include "base/status_macros.h"
#include "client/client.h"
#include "client/stats.h"
#include "serve/kvcached_process.h"

namespace kvc::bench {
namespace {

namespace pb = ::kvcache::v1;
using client::CacheClient;
using client::ClientOptions;
using client::RemoteNamespace;
using storage::ChunkKey;
using Clock = std::chrono::steady_clock;

constexpr char kTokenA[] = "soak-token-tenant-a";
constexpr char kTokenM[] = "soak-token-mallory";
constexpr char kModelId[] = "soak-model";

// A chunk's payload, derived from its key: any reader can check what it got.
std::vector<uint8_t> PayloadOf(const ChunkKey& key, size_t bytes) {
  std::vector<uint8_t> p(bytes);
  uint64_t x = key.Prefix64();
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t z = SplitMix64(x);
    std::memcpy(p.data() + i, &z, std::min<size_t>(8, bytes - i));
  }
  return p;
}

uint64_t ProcStatusKb(pid_t pid, const char* field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0)
      return std::strtoull(line.c_str() + std::strlen(field), nullptr, 10);
  }
  return 0;
}

uint64_t OpenFds(pid_t pid) {
  uint64_t n = 0;
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n >= 2 ? n - 2 : 0;  // . and ..
}

// What the soak knows of each chunk of tenant a.
struct ChunkFate {
  bool durable_ack = false;
  bool deleted_or_unsure = false;  // deleted, or a delete whose answer was lost
};

struct Shared {
  std::mutex mu;
  std::unordered_map<ChunkKey, ChunkFate, storage::ChunkKeyHash> chunks;
  std::vector<std::vector<uint32_t>> sample_prefixes;  // for the hostile tenant
  std::map<std::string, uint64_t> errors;              // by status code name
  // Chunks stored and not deleted, kept under `budget` (half the SSD tier) so that nothing
  // acknowledged is evicted — an eviction would be a loss the check cannot tell apart.
  std::atomic<int64_t> live{0};
  int64_t budget = 0;
  std::atomic<uint64_t> stores{0}, durable_acks{0}, memory_acks{0}, fetches{0}, fetched_chunks{0},
      wrong_bytes{0}, pins{0}, deletes{0}, dropped{0}, hostile_calls{0}, cross_tenant_hits{0};
  void Error(const absl::Status& s) {
    std::lock_guard lock(mu);
    ++errors[absl::StatusCodeToString(s.code())];
  }
};

absl::StatusOr<std::pair<std::unique_ptr<CacheClient>, RemoteNamespace>> Connect(
    const std::string& address, const std::string& token, const std::string& config,
    int timeout_ms = 5000) {
  ClientOptions o;
  o.address = address;
  o.bearer_token = token;
  o.timeout_ms = timeout_ms;
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheClient> c, CacheClient::Connect(o));
  KVC_ASSIGN_OR_RETURN(RemoteNamespace ns, c->RegisterNamespace(config, kModelId));
  return std::make_pair(std::move(c), ns);
}

void ClientLoop(int t, uint64_t seed, const std::string& address, const SoakOptions& opt,
                Shared& sh, const std::atomic<bool>& stop) {
  std::mt19937_64 rng(seed ^ (0x51ull * (t + 1)));
  std::unique_ptr<CacheClient> api;
  RemoteNamespace ns;
  std::vector<std::vector<uint32_t>> prefixes;
  std::vector<ChunkKey> mine;  // chunks this client stored and has not deleted
  auto failed = [&](const absl::Status& s) {
    sh.Error(s);
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) api.reset();  // restarted
  };
  while (!stop) {
    if (!api) {
      auto c = Connect(address, kTokenA, opt.model_config_json);
      if (!c.ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      api = std::move(c->first);
      ns = c->second;
    }
    uint64_t op = rng() % 100;
    if (sh.live >= sh.budget && !mine.empty()) op = 90;  // make room: delete instead
    if (op < 45 || prefixes.empty()) {  // store 1–3 new chunks, after an earlier prefix or not
      std::vector<uint32_t> tokens;
      if (!prefixes.empty() && rng() % 3 != 0) tokens = prefixes[rng() % prefixes.size()];
      const size_t base_chunks = tokens.size() / ns.chunk_tokens;
      const size_t add = 1 + rng() % 3;
      for (size_t i = 0; i < add * ns.chunk_tokens; ++i)
        tokens.push_back(static_cast<uint32_t>(rng() % std::max<uint64_t>(ns.vocab_size, 2)));
      const std::vector<ChunkKey> keys = api->Keys(ns, tokens);
      std::vector<uint8_t> payloads;
      for (size_t i = base_chunks; i < keys.size(); ++i) {
        const std::vector<uint8_t> p = PayloadOf(keys[i], ns.chunk_bytes);
        payloads.insert(payloads.end(), p.begin(), p.end());
      }
      std::optional<ChunkKey> parent;
      if (base_chunks > 0) parent = keys[base_chunks - 1];
      const bool durable = rng() % 4 != 0;
      absl::StatusOr<client::StoreResult> r =
          api->Store(ns, parent, std::span(tokens).subspan(base_chunks * ns.chunk_tokens), payloads,
                     durable ? client::Durability::kDurable : client::Durability::kMemory);
      if (!r.ok()) {
        failed(r.status());
        continue;
      }
      ++sh.stores;
      ++(durable ? sh.durable_acks : sh.memory_acks);
      prefixes.push_back(tokens);
      sh.live += static_cast<int64_t>(keys.size() - base_chunks);
      mine.insert(mine.end(), keys.begin() + static_cast<ptrdiff_t>(base_chunks), keys.end());
      std::lock_guard lock(sh.mu);
      for (size_t i = base_chunks; i < keys.size(); ++i) {
        ChunkFate& f = sh.chunks[keys[i]];
        f.durable_ack |= durable;
      }
      if (sh.sample_prefixes.size() < 256) sh.sample_prefixes.push_back(tokens);
    } else if (op < 85) {  // fetch a prefix and check every byte
      const std::vector<uint32_t>& tokens = prefixes[rng() % prefixes.size()];
      const std::vector<ChunkKey> keys = api->Keys(ns, tokens);
      std::vector<uint8_t> out(keys.size() * ns.chunk_bytes);
      absl::StatusOr<size_t> n = api->Fetch(ns, keys, out);
      if (!n.ok()) {
        failed(n.status());
        continue;
      }
      ++sh.fetches;
      sh.fetched_chunks += *n;
      for (size_t i = 0; i < *n; ++i) {
        const std::vector<uint8_t> want = PayloadOf(keys[i], ns.chunk_bytes);
        if (std::memcmp(out.data() + i * ns.chunk_bytes, want.data(), ns.chunk_bytes) != 0)
          ++sh.wrong_bytes;
      }
    } else if (op < 90) {  // pin or unpin a prefix
      const std::vector<ChunkKey> keys = api->Keys(ns, prefixes[rng() % prefixes.size()]);
      absl::StatusOr<uint32_t> r = rng() % 2 ? api->Pin(ns, keys, 60) : api->Unpin(ns, keys);
      if (!r.ok()) failed(r.status());
      ++sh.pins;
    } else if (op < 95) {  // delete one of its chunks
      if (mine.empty()) continue;
      const size_t i = rng() % mine.size();
      const ChunkKey key = mine[i];
      mine[i] = mine.back();
      mine.pop_back();
      {
        std::lock_guard lock(sh.mu);  // whatever the answer, it may be gone
        sh.chunks[key].deleted_or_unsure = true;
      }
      --sh.live;
      absl::StatusOr<uint32_t> r = api->Delete(ns, std::span(&key, 1));
      if (!r.ok()) failed(r.status());
      ++sh.deletes;
    } else {  // a client that gives up mid-stream
      auto quick = Connect(address, kTokenA, opt.model_config_json, /*timeout_ms=*/1);
      if (!quick.ok()) continue;
      const std::vector<ChunkKey> keys =
          quick->first->Keys(quick->second, prefixes[rng() % prefixes.size()]);
      std::vector<uint8_t> out(keys.size() * ns.chunk_bytes);
      absl::StatusOr<size_t> n = quick->first->Fetch(quick->second, keys, out);
      ++sh.dropped;
      if (n.ok()) {
        for (size_t i = 0; i < *n; ++i) {
          const std::vector<uint8_t> want = PayloadOf(keys[i], ns.chunk_bytes);
          if (std::memcmp(out.data() + i * ns.chunk_bytes, want.data(), ns.chunk_bytes) != 0)
            ++sh.wrong_bytes;
        }
      }
    }
  }
}

// Another tenant asks for tenant a's chunks by key and by tokens: it must find nothing.
void HostileLoop(uint64_t seed, const std::string& address, const SoakOptions& opt, Shared& sh,
                 const std::atomic<bool>& stop) {
  std::mt19937_64 rng(seed ^ 0xBADull);
  std::unique_ptr<CacheClient> api;
  RemoteNamespace ns;
  while (!stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!api) {
      auto c = Connect(address, kTokenM, opt.model_config_json);
      if (!c.ok()) continue;
      api = std::move(c->first);
      ns = c->second;
    }
    std::vector<uint32_t> tokens;
    std::vector<ChunkKey> theirs;
    {
      std::lock_guard lock(sh.mu);
      if (sh.sample_prefixes.empty()) continue;
      tokens = sh.sample_prefixes[rng() % sh.sample_prefixes.size()];
      for (const auto& [key, fate] : sh.chunks) {
        theirs.push_back(key);
        if (theirs.size() == 8) break;
      }
    }
    ++sh.hostile_calls;
    absl::StatusOr<client::LookupResult> l = api->Lookup(ns, tokens);
    if (l.ok() && l->matched_chunks > 0) ++sh.cross_tenant_hits;
    std::vector<uint8_t> out(theirs.size() * ns.chunk_bytes);
    absl::StatusOr<size_t> f = api->Fetch(ns, theirs, out);
    if (f.ok() && *f > 0) ++sh.cross_tenant_hits;
    absl::StatusOr<uint32_t> d = api->Delete(ns, theirs);
    if (d.ok() && *d > 0) ++sh.cross_tenant_hits;
    if ((!l.ok() && absl::IsUnavailable(l.status())) ||
        (!f.ok() && absl::IsUnavailable(f.status())))
      api.reset();
  }
}

}  // namespace

absl::StatusOr<nlohmann::json> RunSoak(const SoakOptions& opt) {
  std::error_code ec;
  std::filesystem::remove_all(opt.dir, ec);
  std::filesystem::create_directories(opt.dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", opt.dir, ": ", ec.message()));
  const std::string tokens_file = opt.dir + "/tokens";
  {
    std::ofstream t(tokens_file);
    t << kTokenA << " a\n" << kTokenM << " mallory\n";
  }
  const int port = FreeLoopbackPort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> base = {"--ram-bytes",     std::to_string(opt.ram_bytes),
                                   "--ssd-bytes",     std::to_string(opt.ssd_bytes),
                                   "--auth-tokens",   tokens_file,
                                   "--admin-tenants", "a",
                                   "--log-level",     "warn"};
  std::vector<std::string> faulty = base;
  faulty.insert(faulty.end(), {"--inject-io-faults", std::to_string(opt.io_fault_rate)});
  const std::string data = opt.dir + "/data";
  auto daemon = std::make_unique<serve::KvcachedProcess>(opt.kvcached, data, faulty, port);
  KVC_RETURN_IF_ERROR(daemon->Start());

  const uint64_t seed = std::random_device{}() ^ static_cast<uint64_t>(time(nullptr));
  Shared sh;
  {
    auto c = Connect(address, kTokenA, opt.model_config_json, 30000);
    if (!c.ok()) return c.status();
    KVC_ASSIGN_OR_RETURN(pb::StatsResponse st, c->first->Stats());
    sh.budget = static_cast<int64_t>(st.ssd_capacity_chunks() / 2);
    if (sh.budget < 16)
      return absl::InvalidArgumentError("the SSD tier holds too few chunks to soak");
  }
  std::atomic<bool> stop{false};
  std::mutex daemon_mu;
  std::atomic<uint64_t> restarts{0}, io_errors_seen{0};
  uint64_t max_rss_kb = 0, max_fds = 0, first_fds = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < opt.clients; ++t)
    threads.emplace_back([&, t] { ClientLoop(t, seed, address, opt, sh, stop); });
  threads.emplace_back([&] { HostileLoop(seed, address, opt, sh, stop); });
  std::thread killer([&] {
    std::mt19937_64 rng(seed ^ 0x4B1Cull);
    auto next = Clock::now();
    while (!stop) {
      next += std::chrono::milliseconds(
          static_cast<int>(opt.kill_every_s * 1000 * (0.5 + (rng() % 1000) / 1000.0)));
      while (!stop && Clock::now() < next)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (stop) break;
      std::lock_guard lock(daemon_mu);
      // The daemon's own count of I/O errors before it dies (its Stats, admin tenant).
      if (auto c = Connect(address, kTokenA, opt.model_config_json); c.ok()) {
        if (auto st = c->first->Stats(); st.ok())
          io_errors_seen += st->read_errors() + st->write_errors();
      }
      daemon->Stop(SIGKILL);
      ++restarts;
      for (int tries = 0; tries < 50 && !daemon->Start().ok(); ++tries)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int>(opt.seconds * 1000));
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    std::lock_guard lock(daemon_mu);
    const pid_t pid = daemon->pid();
    if (pid <= 0) continue;
    max_rss_kb = std::max(max_rss_kb, ProcStatusKb(pid, "VmRSS:"));
    const uint64_t fds = OpenFds(pid);
    if (first_fds == 0) first_fds = fds;
    max_fds = std::max(max_fds, fds);
  }
  stop = true;
  killer.join();
  for (auto& t : threads) t.join();

  // One last crash, then a clean start: every durable acknowledgement must be there.
  daemon->Stop(SIGKILL);
  daemon = std::make_unique<serve::KvcachedProcess>(opt.kvcached, data, base, port);
  absl::Status started;
  for (int tries = 0; tries < 50; ++tries) {
    started = daemon->Start();
    if (started.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!started.ok()) return started;
  auto check = Connect(address, kTokenA, opt.model_config_json, 30000);
  if (!check.ok()) return check.status();
  std::vector<ChunkKey> must;
  for (const auto& [key, fate] : sh.chunks)
    if (fate.durable_ack && !fate.deleted_or_unsure) must.push_back(key);
  uint64_t lost = 0, verified = 0;
  const RemoteNamespace& ns = check->second;
  std::vector<uint8_t> out(ns.chunk_bytes);
  for (const ChunkKey& key : must) {
    absl::StatusOr<size_t> n = check->first->Fetch(ns, std::span(&key, 1), out);
    if (!n.ok() || *n != 1) {
      ++lost;
      continue;
    }
    if (out != PayloadOf(key, ns.chunk_bytes)) {
      ++sh.wrong_bytes;
      continue;
    }
    ++verified;
  }
  uint64_t evictions = 0;
  if (auto st = check->first->Stats(); st.ok()) evictions = st->evictions();
  daemon->Stop(SIGTERM);

  nlohmann::json j;
  j["seconds"] = opt.seconds;
  j["clients"] = opt.clients;
  j["seed"] = seed;
  j["io_fault_rate"] = absl::StrCat("1 in ", opt.io_fault_rate);
  j["restarts"] = restarts.load();
  j["stores_acknowledged"] = sh.stores.load();
  j["durable_acknowledgements"] = sh.durable_acks.load();
  j["memory_acknowledgements"] = sh.memory_acks.load();
  j["fetches"] = sh.fetches.load();
  j["fetched_chunks"] = sh.fetched_chunks.load();
  j["pins"] = sh.pins.load();
  j["deletes"] = sh.deletes.load();
  j["dropped_streams"] = sh.dropped.load();
  j["hostile_calls"] = sh.hostile_calls.load();
  j["cross_tenant_hits"] = sh.cross_tenant_hits.load();
  j["daemon_io_errors_seen"] = io_errors_seen.load();
  j["errors_by_code"] = sh.errors;
  j["chunks_checked_at_end"] = must.size();
  j["chunks_verified_at_end"] = verified;
  j["lost"] = lost;
  j["evictions"] = evictions;
  j["live_chunk_budget"] = sh.budget;
  j["wrong_bytes"] = sh.wrong_bytes.load();
  j["max_rss_mib"] = max_rss_kb / 1024.0;
  j["first_fds"] = first_fds;
  j["max_fds"] = max_fds;
  j["passed"] = false;
  j["passed"] = SoakPassed(j);
  std::filesystem::remove_all(opt.dir, ec);
  return j;
}

bool SoakPassed(const nlohmann::json& j) {
  // Descriptors: a fixed set (slabs, RocksDB, sockets) plus one per connection; far past
  // that means a leak.
  return j["lost"] == 0 && j["wrong_bytes"] == 0 && j["cross_tenant_hits"] == 0 &&
         j["max_fds"].get<uint64_t>() < 4 * j["first_fds"].get<uint64_t>() + 256 &&
         j["durable_acknowledgements"].get<uint64_t>() > 0;
}

std::string SoakToText(const nlohmann::json& j) {
  std::string errors;
  for (const auto& [code, n] : j["errors_by_code"].items())
    absl::StrAppend(&errors, errors.empty() ? "" : ", ", code, " ", n.get<uint64_t>());
  return absl::StrFormat(
      "soak: %.0f s, %d clients, SSD faults %s, %d SIGKILL restarts\n"
      "  acknowledged stores %d (durable %d, memory %d); fetches %d (%d chunks, every byte "
      "checked); pins %d; deletes %d; streams dropped mid-way %d\n"
      "  hostile tenant: %d calls, %d hits on the other tenant's chunks\n"
      "  errors answered (not failures): %s; daemon I/O errors seen %d\n"
      "  at the end: %d durable chunks checked, %d verified, %d lost; wrong bytes served %d; "
      "RAM and SSD evictions %d (live chunks kept under %d, half the SSD tier)\n"
      "  daemon: max RSS %.0f MiB, descriptors %d at start, %d at most\n"
      "  %s\n",
      j["seconds"].get<double>(), j["clients"].get<int>(), j["io_fault_rate"].get<std::string>(),
      j["restarts"].get<int>(), j["stores_acknowledged"].get<int>(),
      j["durable_acknowledgements"].get<int>(), j["memory_acknowledgements"].get<int>(),
      j["fetches"].get<int>(), j["fetched_chunks"].get<int>(), j["pins"].get<int>(),
      j["deletes"].get<int>(), j["dropped_streams"].get<int>(), j["hostile_calls"].get<int>(),
      j["cross_tenant_hits"].get<int>(), errors.empty() ? "none" : errors,
      j["daemon_io_errors_seen"].get<int>(), j["chunks_checked_at_end"].get<int>(),
      j["chunks_verified_at_end"].get<int>(), j["lost"].get<int>(), j["wrong_bytes"].get<int>(),
      j["evictions"].get<int>(), j["live_chunk_budget"].get<int>(), j["max_rss_mib"].get<double>(),
      j["first_fds"].get<int>(), j["max_fds"].get<int>(),
      j["passed"].get<bool>() ? "PASSED" : "FAILED");
}

}  // namespace kvc::bench
