#include "bench/kvbench/cluster_bench.h"

#include <grpcpp/grpcpp.h>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "client/cluster_client.h"
#include "cluster/placement.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "serve/kvcached_process.h"
#include "serve/local_cluster.h"

namespace kvc::bench {
namespace {

namespace fs = std::filesystem;
namespace pb = ::kvcache::v1;
using client::CacheApi;
using Clock = std::chrono::steady_clock;

// A lost node leaves the membership after its lease; repair starts after the grace.
constexpr int kLeaseSeconds = 2;
constexpr int kRepairGraceSeconds = 1;
const std::vector<std::string> kNodeFlags = {"--ram-bytes",
                                             "1073741824",
                                             "--ssd-bytes",
                                             "1073741824",
                                             "--cluster-lease-seconds",
                                             std::to_string(kLeaseSeconds),
                                             "--repair-grace-seconds",
                                             std::to_string(kRepairGraceSeconds),
                                             "--repair-mbps",
                                             "0"};

// One system under test: a single kvcached, or a local cluster of N.
struct System {
  int nodes = 1;
  std::unique_ptr<serve::KvcachedProcess> single;
  std::unique_ptr<serve::LocalCluster> cluster;
  std::string address;
  std::string name() const { return nodes == 1 ? "single" : absl::StrCat("cluster-", nodes); }
};

absl::StatusOr<std::unique_ptr<System>> StartSystem(const ClusterBenchOptions& o, int nodes) {
  auto s = std::make_unique<System>();
  s->nodes = nodes;
  const std::string dir = absl::StrCat(o.dir, "/", nodes, "-nodes");
  fs::create_directories(dir);
  if (nodes == 1) {
    s->single = std::make_unique<serve::KvcachedProcess>(
        o.kvcached, dir + "/kvcached",
        std::vector<std::string>(kNodeFlags.begin(), kNodeFlags.begin() + 4));
    KVC_RETURN_IF_ERROR(s->single->Start());
    s->address = s->single->address();
  } else {
    s->cluster = std::make_unique<serve::LocalCluster>(o.kvcached, dir, nodes, kNodeFlags);
    KVC_RETURN_IF_ERROR(s->cluster->Start());
    s->address = s->cluster->url();
  }
  return s;
}

absl::StatusOr<std::unique_ptr<CacheApi>> Connect(const System& s, uint32_t replicas) {
  client::ClientOptions c;
  c.address = s.address;
  c.timeout_ms = 60000;
  c.replicas = replicas;
  return client::ConnectCache(c);
}

// Token ids and payload bytes of `chunks` chunks, from the seed (never all zero).
struct Data {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> payloads;
};
Data MakeData(uint64_t seed, const client::RemoteNamespace& ns, int64_t chunks) {
  std::mt19937_64 rng(seed);
  Data d;
  d.tokens.resize(chunks * ns.chunk_tokens);
  // Below 256: inside every vocabulary (the keys differ all the same).
  for (uint32_t& t : d.tokens) t = static_cast<uint32_t>(rng() % 256);
  d.payloads.resize(chunks * ns.chunk_bytes);
  for (size_t i = 0; i < d.payloads.size(); i += 8) {
    const uint64_t v = rng() | 1;
    std::memcpy(d.payloads.data() + i, &v, std::min<size_t>(8, d.payloads.size() - i));
  }
  return d;
}

// A node's repair state (its Stats; nodes here have no tenants, so Stats shows it).
absl::StatusOr<pb::StatsResponse> NodeStats(const std::string& address) {
  auto stub =
      pb::KVCache::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::StatsResponse resp;
  if (grpc::Status s = stub->Stats(&ctx, pb::StatsRequest(), &resp); !s.ok()) {
    return absl::UnavailableError(absl::StrCat(address, ": ", s.error_message()));
  }
  return resp;
}

// Waits until every node in `live` has completed a repair pass since `passes_before` (its
// count then) and has nothing left to copy; returns the copies' bytes made since.
absl::StatusOr<uint64_t> WaitForRepair(serve::LocalCluster& c, const std::vector<int>& live,
                                       const std::map<int, pb::RepairStats>& before,
                                       double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    bool settled = true;
    uint64_t copied = 0;
    for (int i : live) {
      KVC_ASSIGN_OR_RETURN(pb::StatsResponse s, NodeStats(c.node(i).address()));
      const pb::RepairStats& r = s.repair();
      auto b = before.find(i);
      settled = settled && !r.pending() && !r.running() && r.under_replicated_chunks() == 0 &&
                r.passes() > (b == before.end() ? 0 : b->second.passes());
      copied += r.copied_bytes() - (b == before.end() ? 0 : b->second.copied_bytes());
    }
    if (settled) return copied;
    if (Clock::now() > until) {
      return absl::DeadlineExceededError(absl::StrCat("repair did not settle in ", seconds, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The loss of the fullest node, for good (SIGKILL, its folder deleted): how long until the
// others have copied every chunk it held back to R copies, without any read, and how many
// bytes that moved; then every stored prefix must still fetch byte-exact.
absl::StatusOr<nlohmann::json> MeasureRepair(
    const ClusterBenchOptions& o, System& sys, const client::RemoteNamespace& ns,
    const std::vector<Data>& prefixes, const std::vector<std::vector<storage::ChunkKey>>& keys) {
  serve::LocalCluster& c = *sys.cluster;
  std::vector<int> all;
  for (int i = 0; i < c.size(); ++i) all.push_back(i);
  // Every node checks its chunks once first (the data was stored after its first pass).
  std::map<int, pb::RepairStats> none;
  for (int i : all) {
    KVC_ASSIGN_OR_RETURN(pb::StatsResponse s, NodeStats(c.node(i).address()));
    none[i] = s.repair();
    none[i].set_passes(0);
  }
  KVC_RETURN_IF_ERROR(WaitForRepair(c, all, none, 60).status());
  int victim = 0;
  uint64_t victim_chunks = 0, held_chunks = 0;
  std::map<int, pb::RepairStats> before;
  for (int i : all) {
    KVC_ASSIGN_OR_RETURN(pb::StatsResponse s, NodeStats(c.node(i).address()));
    const uint64_t chunks = s.ssd_chunks();
    held_chunks += chunks;
    if (chunks > victim_chunks) {
      victim_chunks = chunks;
      victim = i;
    }
    before[i] = s.repair();
  }
  std::vector<int> live;
  for (int i : all) {
    if (i != victim) live.push_back(i);
  }
  const auto killed = Clock::now();
  c.node(victim).Stop(SIGKILL);
  std::error_code ec;
  fs::remove_all(absl::StrCat(o.dir, "/", c.size(), "-nodes/", serve::LocalCluster::NodeId(victim)),
                 ec);
  KVC_ASSIGN_OR_RETURN(uint64_t copied, WaitForRepair(c, live, before, 600));
  const double repair_s = std::chrono::duration<double>(Clock::now() - killed).count();
  // Every prefix still whole and exact, from the survivors.
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheApi> reader, Connect(sys, 2));
  KVC_RETURN_IF_ERROR(reader->RegisterNamespace(o.model_config_json, "kvbench-cluster").status());
  std::vector<uint8_t> buf;
  for (size_t p = 0; p < prefixes.size(); ++p) {
    buf.resize(prefixes[p].payloads.size());
    KVC_ASSIGN_OR_RETURN(size_t got, reader->Fetch(ns, keys[p], buf));
    if (got != keys[p].size() || buf != prefixes[p].payloads) {
      return absl::DataLossError(absl::StrCat("after the repair, prefix ", p, " came back with ",
                                              got, " of ", keys[p].size(),
                                              " chunks or wrong bytes"));
    }
  }
  const double data_gb = static_cast<double>(held_chunks) * ns.chunk_bytes / 1e9;  // R copies
  return nlohmann::json{{"killed_node_chunks", victim_chunks},
                        {"cluster_chunk_copies", held_chunks},
                        {"repair_s", repair_s},
                        {"detect_s", kLeaseSeconds + kRepairGraceSeconds},  // of repair_s
                        {"copied_bytes", copied},
                        {"copied_bytes_per_gb_held", copied / data_gb}};
}

}  // namespace

absl::StatusOr<nlohmann::json> RunClusterBench(const ClusterBenchOptions& o) {
  std::error_code ec;
  fs::remove_all(o.dir, ec);
  fs::create_directories(o.dir);
  nlohmann::json out = {{"seconds", o.seconds},
                        {"repetitions", o.repetitions},
                        {"chunks_per_call", o.chunks_per_call},
                        {"resume_tokens", o.resume_tokens},
                        {"cores", std::thread::hardware_concurrency()},
                        {"systems", nlohmann::json::array()}};
  const uint64_t seed = std::random_device{}();
  out["seed"] = seed;
  for (int n : o.nodes) {
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<System> sys, StartSystem(o, n));
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheApi> client, Connect(*sys, n == 1 ? 0 : 2));
    KVC_ASSIGN_OR_RETURN(client::RemoteNamespace ns,
                         client->RegisterNamespace(o.model_config_json, "kvbench-cluster"));
    nlohmann::json js = {{"system", sys->name()}, {"nodes", n}};

    // Prefix fetches.
    std::vector<Data> prefixes;
    std::vector<std::vector<storage::ChunkKey>> keys;
    for (int p = 0; p < o.prefixes; ++p) {
      prefixes.push_back(MakeData(seed + p, ns, o.chunks_per_call));
      KVC_ASSIGN_OR_RETURN(
          client::StoreResult st,
          client->Store(ns, std::nullopt, prefixes.back().tokens, prefixes.back().payloads));
      keys.push_back(st.keys);
    }
    const uint64_t call_bytes = static_cast<uint64_t>(o.chunks_per_call) * ns.chunk_bytes;
    nlohmann::json fetch = nlohmann::json::array();
    for (int clients : o.clients) {
      std::vector<std::unique_ptr<CacheApi>> per;
      for (int c = 0; c < clients; ++c) {
        KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheApi> cc, Connect(*sys, n == 1 ? 0 : 2));
        if (absl::StatusOr<client::RemoteNamespace> r =
                cc->RegisterNamespace(o.model_config_json, "kvbench-cluster");
            !r.ok()) {
          return r.status();
        }
        per.push_back(std::move(cc));
      }
      std::vector<std::vector<uint8_t>> bufs(clients, std::vector<uint8_t>(call_bytes));
      std::vector<double> gbps, p50, p99;
      for (int rep = 0; rep < o.repetitions; ++rep) {
        absl::StatusOr<Sample> s =
            LoopThreads(o.seconds, clients, call_bytes, [&](int t, uint64_t i) -> absl::Status {
              const size_t p = (i * 7 + t * 3) % prefixes.size();
              KVC_ASSIGN_OR_RETURN(size_t got, per[t]->Fetch(ns, keys[p], bufs[t]));
              if (got != keys[p].size() || bufs[t] != prefixes[p].payloads) {
                return absl::DataLossError(absl::StrCat("prefix ", p, ": ", got, " of ",
                                                        keys[p].size(), " chunks, or wrong bytes"));
              }
              return absl::OkStatus();
            });
        if (!s.ok()) return s.status();
        s->Percentiles();
        gbps.push_back(s->gbps());
        p50.push_back(s->p50_us);
        p99.push_back(s->p99_us);
      }
      fetch.push_back({{"clients", clients},
                       {"gbps", Median(gbps)},
                       {"p50_us", Median(p50)},
                       {"p99_us", Median(p99)}});
    }
    js["prefix_fetch"] = fetch;

    // Resume: Lookup and Fetch of a resume_tokens prefix, freshly connected each time.
    const int64_t resume_chunks = o.resume_tokens / ns.chunk_tokens;
    Data resume = MakeData(seed ^ 0x5eed, ns, resume_chunks);
    if (absl::StatusOr<client::StoreResult> st =
            client->Store(ns, std::nullopt, resume.tokens, resume.payloads);
        !st.ok()) {
      return st.status();
    }
    std::vector<uint8_t> pages(resume.payloads.size());
    // One resume, every byte checked: Lookup's and Lookup + Fetch's milliseconds, and the
    // tiers Lookup reported.
    struct Timed {
      double lookup_ms = 0, total_ms = 0;
      std::vector<client::Tier> tiers;
    };
    auto time_resume = [&](CacheApi& c) -> absl::StatusOr<Timed> {
      const auto t0 = Clock::now();
      KVC_ASSIGN_OR_RETURN(client::LookupResult look, c.Lookup(ns, resume.tokens));
      const auto t1 = Clock::now();
      KVC_ASSIGN_OR_RETURN(size_t got, c.Fetch(ns, look.keys, pages));
      const auto t2 = Clock::now();
      if (look.matched_chunks != resume_chunks || got != static_cast<size_t>(resume_chunks) ||
          pages != resume.payloads) {
        return absl::DataLossError("the resume prefix did not come back whole and exact");
      }
      return Timed{std::chrono::duration<double, std::milli>(t1 - t0).count(),
                   std::chrono::duration<double, std::milli>(t2 - t0).count(), look.tiers};
    };
    std::vector<double> resume_ms, lookup_ms;
    for (int rep = 0; rep < o.repetitions; ++rep) {
      KVC_ASSIGN_OR_RETURN(Timed t, time_resume(*client));
      lookup_ms.push_back(t.lookup_ms);
      resume_ms.push_back(t.total_ms);
    }
    js["resume"] = {{"chunks", resume_chunks},
                    {"bytes", resume.payloads.size()},
                    {"lookup_ms", Median(lookup_ms)},
                    {"lookup_and_fetch_ms", Median(resume_ms)}};

    // The same resume from SSD (one node): the daemon is restarted before each one, so its
    // RAM tier is empty and every chunk is read from the slabs — a session coming back
    // days later. The restart itself is not timed.
    if (n == 1) {
      std::vector<double> ssd_ms;
      for (int rep = 0; rep < o.repetitions; ++rep) {
        sys->single->Stop(SIGTERM);
        KVC_RETURN_IF_ERROR(sys->single->Start());
        sys->address = sys->single->address();
        KVC_ASSIGN_OR_RETURN(client, Connect(*sys, 0));
        if (absl::StatusOr<client::RemoteNamespace> r =
                client->RegisterNamespace(o.model_config_json, "kvbench-cluster");
            !r.ok()) {
          return r.status();
        }
        KVC_ASSIGN_OR_RETURN(Timed t, time_resume(*client));
        for (const client::Tier tier : t.tiers) {
          if (tier != client::Tier::kSsd)
            return absl::InternalError("a restarted daemon had RAM hits");
        }
        ssd_ms.push_back(t.total_ms);
      }
      js["resume_from_ssd"] = {{"chunks", resume_chunks}, {"lookup_and_fetch_ms", Median(ssd_ms)}};
    }

    // Lookup of a long cached prefix (the planners' 1M tokens): every chunk is stored
    // first, then Lookup is timed call by call.
    if (o.lookup_tokens > 0) {
      const int64_t chunks = o.lookup_tokens / ns.chunk_tokens;
      Data longp = MakeData(seed ^ 0x10ca1, ns, chunks);
      for (int64_t c = 0; c < chunks; c += 256) {  // in slices: bounded messages per stream
        const int64_t k = std::min<int64_t>(256, chunks - c);
        std::optional<storage::ChunkKey> parent;
        if (c > 0) {
          parent = client->Keys(ns, std::span(longp.tokens).first(c * ns.chunk_tokens)).back();
        }
        if (absl::StatusOr<client::StoreResult> st = client->Store(
                ns, parent,
                std::span(longp.tokens).subspan(c * ns.chunk_tokens, k * ns.chunk_tokens),
                std::span(longp.payloads).subspan(c * ns.chunk_bytes, k * ns.chunk_bytes));
            !st.ok()) {
          return st.status();
        }
      }
      longp.payloads.clear();
      // One way of asking, timed call by call: {p50_ms, p99_ms} (medians over the reps).
      // `ask` answers how many leading chunks are cached; all of them must be.
      auto time_lookup = [&](auto ask) -> absl::StatusOr<nlohmann::json> {
        std::vector<double> p50, p99;
        for (int rep = 0; rep < o.repetitions; ++rep) {
          absl::StatusOr<Sample> s = Loop(o.seconds, 0, [&](uint64_t) -> absl::Status {
            KVC_ASSIGN_OR_RETURN(uint32_t matched, ask());
            if (matched != chunks) {
              return absl::DataLossError(
                  absl::StrCat("Lookup matched ", matched, " of ", chunks, " chunks"));
            }
            return absl::OkStatus();
          });
          if (!s.ok()) return s.status();
          s->Percentiles();
          p50.push_back(s->p50_us);
          p99.push_back(s->p99_us);
        }
        return nlohmann::json{{"p50_ms", Median(p50) / 1000}, {"p99_ms", Median(p99) / 1000}};
      };
      // What a worker asks: the tokens (hashed by the client, the keys sent packed).
      absl::StatusOr<nlohmann::json> by_tokens = time_lookup([&]() -> absl::StatusOr<uint32_t> {
        KVC_ASSIGN_OR_RETURN(client::LookupResult l, client->Lookup(ns, longp.tokens));
        return l.matched_chunks;
      });
      if (!by_tokens.ok()) return by_tokens.status();
      js["lookup"] = *by_tokens;
      js["lookup"]["tokens"] = chunks * ns.chunk_tokens;
      js["lookup"]["chunks"] = chunks;
      if (n == 1) {
        // One node: a worker that kept its keys from the last turn (no hashing), and the
        // same keys sent one protobuf string each (before packed keys), on one channel.
        const std::vector<storage::ChunkKey> long_keys = client->Keys(ns, longp.tokens);
        auto channel = grpc::CreateChannel(sys->address, grpc::InsecureChannelCredentials());
        std::unique_ptr<pb::KVCache::Stub> stub = pb::KVCache::NewStub(channel);
        auto ask_keys = [&](bool packed) -> absl::StatusOr<uint32_t> {
          pb::LookupRequest req;
          req.set_namespace_id(ns.id);
          for (const storage::ChunkKey& k : long_keys) {
            const char* b = reinterpret_cast<const char*>(k.bytes.data());
            if (packed) {
              req.mutable_packed_chunk_keys()->append(b, 16);
            } else {
              req.add_chunk_keys(std::string(b, 16));
            }
          }
          pb::LookupResponse resp;
          grpc::ClientContext ctx;
          if (grpc::Status st = stub->Lookup(&ctx, req, &resp); !st.ok()) {
            return absl::UnavailableError(st.error_message());
          }
          return resp.matched_chunks();
        };
        KVC_ASSIGN_OR_RETURN(nlohmann::json packed, time_lookup([&] { return ask_keys(true); }));
        KVC_ASSIGN_OR_RETURN(nlohmann::json unpacked, time_lookup([&] { return ask_keys(false); }));
        js["lookup"]["kept_keys_packed"] = packed;
        js["lookup"]["kept_keys_one_string_each"] = unpacked;
      }
    }

    // Durable stores of fresh prefixes, R = 1 and R = 2 (a single node: R = 1 only).
    nlohmann::json stores = nlohmann::json::array();
    for (uint32_t r : n == 1 ? std::vector<uint32_t>{1} : std::vector<uint32_t>{1, 2}) {
      KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheApi> sc, Connect(*sys, r));
      if (absl::StatusOr<client::RemoteNamespace> rn =
              sc->RegisterNamespace(o.model_config_json, "kvbench-cluster");
          !rn.ok()) {
        return rn.status();
      }
      std::vector<double> gbps;
      uint64_t next = 0;
      for (int rep = 0; rep < o.repetitions; ++rep) {
        absl::StatusOr<Sample> s = Loop(o.seconds, call_bytes, [&](uint64_t) -> absl::Status {
          Data d = MakeData(seed + 1000003 * r + next++, ns, o.chunks_per_call);
          return sc->Store(ns, std::nullopt, d.tokens, d.payloads).status();
        });
        if (!s.ok()) return s.status();
        gbps.push_back(s->gbps());
      }
      stores.push_back({{"replicas", r}, {"gbps", Median(gbps)}});
    }
    js["store"] = stores;
    out["systems"].push_back(js);
  }
  // The repair after a node loss, on a fresh cluster holding a data set that fits its nodes
  // (the systems above are full of the runs' stores: eviction would blur what repair did).
  const int repair_nodes = *std::max_element(o.nodes.begin(), o.nodes.end());
  if (o.repair_chunks > 0 && repair_nodes >= 3) {
    ClusterBenchOptions ro = o;
    ro.dir = o.dir + "/repair";
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<System> sys, StartSystem(ro, repair_nodes));
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheApi> client, Connect(*sys, 2));
    KVC_ASSIGN_OR_RETURN(client::RemoteNamespace ns,
                         client->RegisterNamespace(o.model_config_json, "kvbench-cluster"));
    std::vector<Data> prefixes;
    std::vector<std::vector<storage::ChunkKey>> keys;
    for (int64_t at = 0; at < o.repair_chunks; at += o.chunks_per_call) {
      prefixes.push_back(MakeData(seed ^ (0xAE9A1Full + static_cast<uint64_t>(at)), ns,
                                  std::min<int64_t>(o.chunks_per_call, o.repair_chunks - at)));
      KVC_ASSIGN_OR_RETURN(
          client::StoreResult st,
          client->Store(ns, std::nullopt, prefixes.back().tokens, prefixes.back().payloads));
      keys.push_back(st.keys);
    }
    KVC_ASSIGN_OR_RETURN(out["repair"], MeasureRepair(ro, *sys, ns, prefixes, keys));
    out["repair"]["system"] = sys->name();
    out["repair"]["stored_chunks"] = o.repair_chunks;
  }
  // Ratios against the single node of the same run.
  const nlohmann::json* single = nullptr;
  for (const auto& s : out["systems"]) {
    if (s["nodes"] == 1) single = &s;
  }
  if (single != nullptr) {
    for (auto& s : out["systems"]) {
      if (s["nodes"] == 1) continue;
      for (size_t i = 0; i < s["prefix_fetch"].size(); ++i) {
        s["prefix_fetch"][i]["vs_single"] = s["prefix_fetch"][i]["gbps"].get<double>() /
                                            (*single)["prefix_fetch"][i]["gbps"].get<double>();
      }
      s["resume"]["vs_single"] = s["resume"]["lookup_and_fetch_ms"].get<double>() /
                                 (*single)["resume"]["lookup_and_fetch_ms"].get<double>();
      s["store"][1]["vs_r1"] =
          s["store"][1]["gbps"].get<double>() / s["store"][0]["gbps"].get<double>();
    }
  }
  // Lookup's fan-out at fleet sizes no machine here runs: the plan is pure (placement.h),
  // so it is computed for simulated members. R = 2 with the client's default extra nodes,
  // against the wide ask of an unsettled cluster (every member, every key).
  std::mt19937_64 rng(seed);
  const size_t ask = 2 + client::ClientOptions{}.lookup_extra_nodes;
  for (size_t members : {3, 16, 100, 300}) {
    std::vector<std::string> ids;
    for (size_t i = 0; i < members; ++i) ids.push_back(absl::StrCat("node-", i));
    for (size_t chunks : {32, 4096}) {
      std::vector<storage::ChunkKey> keys(chunks);
      for (storage::ChunkKey& k : keys)
        for (uint8_t& b : k.bytes) b = static_cast<uint8_t>(rng());
      const cluster::FanOut narrow = cluster::FanOutOf(cluster::PlanLookup(keys, ids, ask));
      const cluster::FanOut wide = cluster::FanOutOf(cluster::PlanLookup(keys, ids, members));
      out["lookup_fanout"].push_back({{"members", members},
                                      {"chunks", chunks},
                                      {"nodes_per_key", ask},
                                      {"calls", narrow.nodes},
                                      {"keys_asked", narrow.keys},
                                      {"calls_every_member", wide.nodes},
                                      {"keys_asked_every_member", wide.keys}});
    }
  }
  return out;
}

std::string ClusterBenchToText(const nlohmann::json& r) {
  std::string t = absl::StrFormat(
      "kvbench cluster: %d-chunk prefix fetches, %.1f s x %d reps (medians); all nodes on this "
      "machine's %d cores\n\n%-10s %7s %9s %9s %9s %9s\n",
      r["chunks_per_call"].get<int>(), r["seconds"].get<double>(), r["repetitions"].get<int>(),
      r["cores"].get<int>(), "system", "clients", "GB/s", "p50 ms", "p99 ms", "vs single");
  for (const auto& s : r["systems"]) {
    for (const auto& f : s["prefix_fetch"]) {
      absl::StrAppendFormat(
          &t, "%-10s %7d %9.2f %9.2f %9.2f %9s\n", s["system"].get<std::string>(),
          f["clients"].get<int>(), f["gbps"].get<double>(), f["p50_us"].get<double>() / 1000,
          f["p99_us"].get<double>() / 1000,
          f.contains("vs_single") ? absl::StrFormat("%.2f", f["vs_single"].get<double>()) : "-");
    }
  }
  absl::StrAppendFormat(&t, "\nresume of a %lld-token prefix (Lookup + Fetch):\n",
                        r["resume_tokens"].get<long long>());
  for (const auto& s : r["systems"]) {
    absl::StrAppendFormat(
        &t, "%-10s %5d chunks  lookup %7.1f ms  total %7.1f ms%s\n", s["system"].get<std::string>(),
        s["resume"]["chunks"].get<int>(), s["resume"]["lookup_ms"].get<double>(),
        s["resume"]["lookup_and_fetch_ms"].get<double>(),
        s["resume"].contains("vs_single") ? absl::StrFormat("  (%.2fx the single node's time)",
                                                            s["resume"]["vs_single"].get<double>())
                                          : "");
    if (s.contains("resume_from_ssd")) {
      absl::StrAppendFormat(&t, "%-10s %5d chunks  from SSD after a restart: total %7.1f ms\n",
                            s["system"].get<std::string>(),
                            s["resume_from_ssd"]["chunks"].get<int>(),
                            s["resume_from_ssd"]["lookup_and_fetch_ms"].get<double>());
    }
  }
  if (r["systems"].size() > 0 && r["systems"][0].contains("lookup")) {
    absl::StrAppendFormat(&t, "\nLookup of a cached %lld-token prefix:\n",
                          r["systems"][0]["lookup"]["tokens"].get<long long>());
    for (const auto& s : r["systems"]) {
      absl::StrAppendFormat(&t, "%-10s %5d chunks  p50 %7.2f ms  p99 %7.2f ms\n",
                            s["system"].get<std::string>(), s["lookup"]["chunks"].get<int>(),
                            s["lookup"]["p50_ms"].get<double>(),
                            s["lookup"]["p99_ms"].get<double>());
      for (const char* kept : {"kept_keys_packed", "kept_keys_one_string_each"}) {
        if (!s["lookup"].contains(kept)) continue;
        const auto& l = s["lookup"][kept];
        absl::StrAppendFormat(&t, "  %-26s  p50 %7.2f ms  p99 %7.2f ms\n", kept,
                              l["p50_ms"].get<double>(), l["p99_ms"].get<double>());
      }
    }
  }
  if (r.contains("lookup_fanout")) {
    t += "\nLookup fan-out (R = 2 and the default extra ranked nodes; simulated members): calls "
         "and keys asked, and with every member asked\n";
    for (const auto& f : r["lookup_fanout"]) {
      absl::StrAppendFormat(&t,
                            "  %4d members %5d chunks: %4d calls %7d keys  |  %4d calls %8d keys\n",
                            f["members"].get<int>(), f["chunks"].get<int>(), f["calls"].get<int>(),
                            f["keys_asked"].get<int>(), f["calls_every_member"].get<int>(),
                            f["keys_asked_every_member"].get<int>());
    }
  }
  if (r.contains("repair")) {
    const auto& rp = r["repair"];
    absl::StrAppendFormat(
        &t,
        "\nrepair after the loss of the fullest node of %s holding %lld chunks, R = 2 (SIGKILL, "
        "folder deleted; no reads): %lld of %lld chunk copies lost, back to R = 2 in %.1f s (of "
        "which %.0f s lease + grace), %.1f MB copied (%.0f MB per GB held); every prefix then "
        "fetched exact\n",
        rp["system"].get<std::string>(), rp["stored_chunks"].get<long long>(),
        rp["killed_node_chunks"].get<long long>(), rp["cluster_chunk_copies"].get<long long>(),
        rp["repair_s"].get<double>(), rp["detect_s"].get<double>(),
        rp["copied_bytes"].get<double>() / 1e6, rp["copied_bytes_per_gb_held"].get<double>() / 1e6);
  }
  t += "\ndurable stores:\n";
  for (const auto& s : r["systems"]) {
    for (const auto& st : s["store"]) {
      absl::StrAppendFormat(
          &t, "%-10s R=%d %9.3f GB/s%s\n", s["system"].get<std::string>(),
          st["replicas"].get<int>(), st["gbps"].get<double>(),
          st.contains("vs_r1") ? absl::StrFormat("  (%.2fx R=1)", st["vs_r1"].get<double>()) : "");
    }
  }
  return t;
}

}  // namespace kvc::bench
