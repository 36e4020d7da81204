// Sessions outlive every node (docs/rados.md): kvcached nodes with RADOS as their shared
// tier store sessions durably, then every one of them is SIGKILLed and its data folder
// deleted; a node started empty finds every session in RADOS (TIER_RADOS), serves each byte
// exact, and keeps a copy (the next lookup is its own RAM). A real Ceph cluster, real
// kvcached processes, gRPC on loopback.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/loopback_port.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.pb.h"
#include "serve/kvcached_process.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/ceph_cluster.h"
#include "tests/testing/http_get.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

using client::CacheClient;
using client::RemoteNamespace;
using storage::ChunkKey;

constexpr char kModelId[] = "fleet-model";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class RadosFleetTest : public testing::CephClusterTest {
 protected:
  std::unique_ptr<serve::KvcachedProcess> Node(const std::string& dir,
                                               const std::vector<std::string>& more = {}) {
    std::vector<std::string> flags{"--ram-bytes",  "64000000", "--ssd-bytes", "256000000",
                                   "--rados-pool", kPool,      "--ceph-conf", conf_,
                                   "--log-level",  "warn"};
    flags.insert(flags.end(), more.begin(), more.end());
    auto node = std::make_unique<serve::KvcachedProcess>(std::string(KVC_BIN_DIR) + "/kvcached",
                                                         dir, flags);
    EXPECT_EQ(node->Start(), absl::OkStatus()) << "its log: " << dir << ".log";
    return node;
  }
  std::pair<std::unique_ptr<CacheClient>, RemoteNamespace> Connect(const std::string& address,
                                                                   const char* model = kModelId) {
    client::ClientOptions o;
    o.address = address;
    absl::StatusOr<std::unique_ptr<CacheClient>> c = CacheClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    absl::StatusOr<RemoteNamespace> ns = (*c)->RegisterNamespace(
        ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"), model);
    EXPECT_TRUE(ns.ok()) << ns.status();
    return {*std::move(c), ns.value_or(RemoteNamespace{})};
  }
};

TEST_F(RadosFleetTest, EveryNodeKilledAndItsFolderDeletedLosesNoDurableSession) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  constexpr int kNodes = 2, kSessionsPerNode = 3, kChunksPerSession = 24;
  std::vector<std::vector<uint32_t>> durable, memory_only;
  std::vector<std::unique_ptr<serve::KvcachedProcess>> nodes;
  for (int n = 0; n < kNodes; ++n) {
    nodes.push_back(Node(dir.File("node" + std::to_string(n))));
    ASSERT_GT(nodes.back()->pid(), 0);
    auto [api, ns] = Connect(nodes.back()->address());
    ASSERT_NE(api, nullptr);
    for (int s = 0; s <= kSessionsPerNode; ++s) {
      std::vector<uint32_t> tokens(kChunksPerSession * ns.chunk_tokens);
      for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % ns.vocab_size);
      const std::vector<ChunkKey> keys = api->Keys(ns, tokens);
      std::vector<uint8_t> payloads;
      for (const ChunkKey& k : keys) {
        const std::vector<uint8_t> p = testing::PayloadOf(k, ns.chunk_bytes);
        payloads.insert(payloads.end(), p.begin(), p.end());
      }
      // The last session of each node is stored with memory durability: it is not
      // promised to outlive the node (and is not checked).
      const bool is_durable = s < kSessionsPerNode;
      absl::StatusOr<client::StoreResult> r =
          api->Store(ns, std::nullopt, tokens, payloads,
                     is_durable ? client::Durability::kDurable : client::Durability::kMemory);
      ASSERT_TRUE(r.ok()) << r.status();
      (is_durable ? durable : memory_only).push_back(tokens);
    }
  }
  // The whole fleet is lost: every node killed, every folder deleted.
  for (int n = 0; n < kNodes; ++n) {
    nodes[n]->Stop(SIGKILL);
    std::filesystem::remove_all(dir.File("node" + std::to_string(n)));
  }
  auto fresh = Node(dir.File("fresh"));
  ASSERT_GT(fresh->pid(), 0);
  // Another model registers first here: the session's namespace must still name the
  // objects its chunks were stored as (ids derived, not in registration order).
  auto other = Connect(fresh->address(), "another-model");
  ASSERT_NE(other.first, nullptr);
  auto [api, ns] = Connect(fresh->address());
  ASSERT_NE(api, nullptr);
  for (size_t s = 0; s < durable.size(); ++s) {
    absl::StatusOr<client::LookupResult> found = api->Lookup(ns, durable[s]);
    ASSERT_TRUE(found.ok()) << found.status();
    ASSERT_EQ(found->matched_chunks, static_cast<uint32_t>(kChunksPerSession)) << "session " << s;
    for (client::Tier t : found->tiers) EXPECT_EQ(t, client::Tier::kRados) << "session " << s;
    std::vector<uint8_t> out(found->keys.size() * ns.chunk_bytes);
    absl::StatusOr<size_t> n = api->Fetch(ns, found->keys, out);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_EQ(*n, found->keys.size()) << "session " << s;
    for (size_t i = 0; i < *n; ++i) {
      const std::vector<uint8_t> want = testing::PayloadOf(found->keys[i], ns.chunk_bytes);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin() + i * ns.chunk_bytes))
          << "session " << s << " chunk " << i;
    }
    // Promoted: the fresh node holds it now.
    absl::StatusOr<client::LookupResult> again = api->Lookup(ns, durable[s]);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_EQ(again->matched_chunks, static_cast<uint32_t>(kChunksPerSession));
    EXPECT_EQ(again->tiers[0], client::Tier::kRam) << "session " << s;
  }
  absl::StatusOr<kvcache::v1::StatsResponse> st = api->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->shared_tier().name(), "rados");
  EXPECT_EQ(st->shared_tier().hits(), durable.size() * kChunksPerSession);
  EXPECT_TRUE(st->shared_tier().reachable());
  // A memory-durability session never reached RADOS: a miss on the fresh node.
  absl::StatusOr<client::LookupResult> lost = api->Lookup(ns, memory_only[0]);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->matched_chunks, 0u);
  fresh->Stop(SIGTERM);
}

// The whole Ceph cluster stops answering (monitor and OSD SIGSTOPped) under a kvcached
// with write-behind: every call still answers within the operation timeout — sessions on
// the node are served from RAM and SSD, a durable store is acknowledged and waits in the
// backlog, a miss is a miss —, Stats, the quota's count and Prometheus say RADOS is not
// answering. When the cluster runs again the backlog drains into it: a fresh node whose
// folder is new finds the session stored during the outage there.
TEST_F(RadosFleetTest, TheCephClusterStoppedTheNodeKeepsServingAndCatchesUpAfter) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  const int metrics_port = FreeLoopbackPort();
  constexpr uint64_t kQuota = 1ull << 30;
  auto node = Node(dir.File("node"), {"--rados-write-behind", "--rados-op-timeout-seconds", "2",
                                      "--rados-retry-after-seconds", "1", "--tenant-quota",
                                      "default:rados=" + std::to_string(kQuota), "--metrics-listen",
                                      "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_GT(node->pid(), 0);
  auto [api, ns] = Connect(node->address());
  ASSERT_NE(api, nullptr);
  constexpr int kChunks = 8;
  auto session = [&] {
    std::vector<uint32_t> tokens(kChunks * ns.chunk_tokens);
    for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % ns.vocab_size);
    return tokens;
  };
  auto store = [&](const std::vector<uint32_t>& tokens) {
    std::vector<uint8_t> payloads;
    for (const ChunkKey& k : api->Keys(ns, tokens)) {
      const std::vector<uint8_t> p = testing::PayloadOf(k, ns.chunk_bytes);
      payloads.insert(payloads.end(), p.begin(), p.end());
    }
    return api->Store(ns, std::nullopt, tokens, payloads, client::Durability::kDurable);
  };
  // Served whole and exact (from wherever the node has it).
  auto served = [&](const std::vector<uint32_t>& tokens) {
    absl::StatusOr<client::LookupResult> found = api->Lookup(ns, tokens);
    if (!found.ok() || found->matched_chunks != kChunks) return false;
    std::vector<uint8_t> out(found->keys.size() * ns.chunk_bytes);
    absl::StatusOr<size_t> n = api->Fetch(ns, found->keys, out);
    if (!n.ok() || *n != found->keys.size()) return false;
    for (size_t i = 0; i < *n; ++i) {
      const std::vector<uint8_t> want = testing::PayloadOf(found->keys[i], ns.chunk_bytes);
      if (!std::equal(want.begin(), want.end(), out.begin() + i * ns.chunk_bytes)) return false;
    }
    return true;
  };
  const std::vector<uint32_t> before = session(), during = session(), never = session();
  // Waits until the backlog is sent and the tier answers (the writer retries each second).
  auto drained = [&] {
    absl::StatusOr<kvcache::v1::StatsResponse> s;
    for (int i = 0; i < 300; ++i) {
      s = api->Stats();
      if (s.ok() && s->shared_tier().backlog_chunks() == 0 && s->shared_tier().reachable())
        return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "the backlog did not drain: "
                  << (s.ok() ? s->shared_tier().DebugString() : s.status().ToString());
    return s;
  };
  ASSERT_TRUE(store(before).ok());
  (void)drained();

  SignalDaemons(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<client::StoreResult> stored = store(during);
  ASSERT_TRUE(stored.ok()) << "write-behind acknowledges on the node's SSD: " << stored.status();
  EXPECT_TRUE(served(before));
  EXPECT_TRUE(served(during));
  absl::StatusOr<client::LookupResult> miss = api->Lookup(ns, never);  // asks RADOS: times out
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->matched_chunks, 0u);
  const double outage_calls_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(outage_calls_s, 3 * 2.0) << "each call bounded by the 2 s operation timeout";
  absl::StatusOr<kvcache::v1::StatsResponse> st = api->Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_FALSE(st->shared_tier().reachable());
  EXPECT_FALSE(st->shared_tier().last_error().empty());
  EXPECT_GT(st->shared_tier().backlog_chunks(), 0u);
  EXPECT_EQ(st->quota().rados_bytes_limit(), kQuota);
  EXPECT_FALSE(st->quota().rados_error().empty()) << "the count cannot be read now";
  const std::string text = testing::HttpGet(metrics_port, "/metrics");
  EXPECT_NE(text.find("kvcache_shared_tier_reachable 0"), std::string::npos) << text;
  EXPECT_EQ(text.find("kvcache_shared_tier_backlog_chunks 0\n"), std::string::npos) << text;

  SignalDaemons(SIGCONT);
  st = drained();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->quota().rados_bytes(), 2u * kChunks * ns.chunk_bytes) << st->quota().rados_error();
  node->Stop(SIGKILL);
  std::filesystem::remove_all(dir.File("node"));
  auto fresh = Node(dir.File("fresh"));
  auto [api2, ns2] = Connect(fresh->address());
  ASSERT_NE(api2, nullptr);
  absl::StatusOr<client::LookupResult> found = api2->Lookup(ns2, during);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->matched_chunks, static_cast<uint32_t>(kChunks)) << "stored in the outage";
  EXPECT_EQ(found->tiers[0], client::Tier::kRados);
  fresh->Stop(SIGTERM);
}

// Chunks stored with a TTL that nobody reads again leave the pool: kvcached's sweep
// (--rados-sweep-seconds) removes them once they expire, and their bytes leave the
// tenant's count; chunks without a TTL stay.
TEST_F(RadosFleetTest, TheSweepRemovesExpiredChunksNobodyReads) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  auto node = Node(dir.File("node"),
                   {"--rados-sweep-seconds", "0.5", "--tenant-quota", "default:rados=1G"});
  ASSERT_GT(node->pid(), 0);
  auto [api, ns] = Connect(node->address());
  ASSERT_NE(api, nullptr);
  constexpr int kChunks = 6;
  auto store = [&](uint32_t ttl_s) {
    std::vector<uint32_t> tokens(kChunks * ns.chunk_tokens);
    for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % ns.vocab_size);
    std::vector<uint8_t> payloads;
    for (const ChunkKey& k : api->Keys(ns, tokens)) {
      const std::vector<uint8_t> p = testing::PayloadOf(k, ns.chunk_bytes);
      payloads.insert(payloads.end(), p.begin(), p.end());
    }
    EXPECT_TRUE(
        api->Store(ns, std::nullopt, tokens, payloads, client::Durability::kDurable, ttl_s).ok());
    return tokens;
  };
  const std::vector<uint32_t> kept = store(0);
  (void)store(1);
  const uint64_t kept_bytes = kChunks * ns.chunk_bytes;
  bool swept = false;
  absl::StatusOr<kvcache::v1::StatsResponse> st;
  for (int i = 0; i < 100 && !swept; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    st = api->Stats();
    swept = st.ok() && st->shared_tier().swept() == kChunks;
  }
  ASSERT_TRUE(swept) << (st.ok() ? st->shared_tier().DebugString() : st.status().ToString());
  EXPECT_GT(st->shared_tier().sweeps(), 0u);
  EXPECT_EQ(st->quota().rados_bytes(), kept_bytes);
  node->Stop(SIGKILL);
  std::filesystem::remove_all(dir.File("node"));
  auto fresh = Node(dir.File("fresh"));
  auto [api2, ns2] = Connect(fresh->address());
  ASSERT_NE(api2, nullptr);
  absl::StatusOr<client::LookupResult> found = api2->Lookup(ns2, kept);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->matched_chunks, static_cast<uint32_t>(kChunks));
  fresh->Stop(SIGTERM);
}

}  // namespace
}  // namespace kvc
