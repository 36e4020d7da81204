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
#include <vector>

#include "client/client.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.pb.h"
#include "serve/kvcached_process.h"
#include "tests/storage/store_testing.h"
#include "tests/testing/ceph_cluster.h"
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
  std::unique_ptr<serve::KvcachedProcess> Node(const std::string& dir) {
    auto node = std::make_unique<serve::KvcachedProcess>(
        std::string(KVC_BIN_DIR) + "/kvcached", dir,
        std::vector<std::string>{"--ram-bytes", "64000000", "--ssd-bytes", "256000000",
                                 "--rados-pool", kPool, "--ceph-conf", conf_, "--log-level",
                                 "warn"});
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

}  // namespace
}  // namespace kvc
